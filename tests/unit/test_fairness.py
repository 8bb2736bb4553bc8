"""Fair engine access, counted: with every slot taken, freed slots go round-robin across the
tenants that wait, so a tenant with 100 waiting turns cannot starve one with a single turn."""

from __future__ import annotations

import asyncio

import pytest

from responses_cache.limits.fairness import EngineSlot, FairGate


async def _grants(gate: FairGate, waiters: list[tuple[str, int]]) -> list[str]:
    """Queue ``waiters`` (tenant, priority) behind a held slot, then free slots one at a time:
    the tenants in the order they got them."""
    held = await gate.acquire("holder")
    order: list[str] = []

    async def wait(tenant: str, priority: int) -> None:
        slot = await gate.acquire(tenant, priority)
        order.append(tenant)
        await released.wait()
        slot.release()

    released = asyncio.Event()
    tasks = [asyncio.ensure_future(wait(t, p)) for t, p in waiters]
    for _ in range(3):
        await asyncio.sleep(0)  # every waiter reaches the gate
    assert gate.waiting == len(waiters)
    held.release()
    while len(order) < len(waiters):
        count = len(order)
        released.set()
        while len(order) == count:
            await asyncio.sleep(0)
        released.clear()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    return order


async def test_one_waiting_turn_is_not_starved_by_a_hundred() -> None:
    order = await _grants(FairGate(1), [("busy", 0)] * 100 + [("quiet", 0)])
    assert order.index("quiet") == 1  # the second slot freed goes to it, not the 101st


async def test_tenants_alternate_while_both_wait() -> None:
    order = await _grants(FairGate(1), [("a", 0)] * 3 + [("b", 0)] * 3)
    assert order == ["a", "b", "a", "b", "a", "b"]


async def test_inside_a_tenant_lower_priority_values_go_first() -> None:
    gate = FairGate(1)
    order: list[int] = []
    held = await gate.acquire("t")

    async def wait(priority: int) -> None:
        slot = await gate.acquire("t", priority)
        order.append(priority)
        slot.release()

    tasks = [asyncio.ensure_future(wait(p)) for p in (5, 0, 3)]
    await asyncio.sleep(0)
    held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == [0, 3, 5]


async def test_a_cancelled_wait_leaves_the_queue_and_slots_are_not_lost() -> None:
    gate = FairGate(1)
    held = await gate.acquire("a")
    gone = asyncio.ensure_future(gate.acquire("b"))
    stays = asyncio.ensure_future(gate.acquire("c"))
    await asyncio.sleep(0)
    gone.cancel()
    held.release()
    slot = await asyncio.wait_for(stays, 5)
    assert isinstance(slot, EngineSlot) and gate.free == 0
    slot.release()
    slot.release()  # twice: nothing
    assert gate.free == 1 and gate.waiting == 0
    with pytest.raises(asyncio.CancelledError):
        await gone


async def test_free_slots_are_taken_at_once() -> None:
    gate = FairGate(2)
    a, b = await gate.acquire("a"), await gate.acquire("a")
    assert gate.free == 0
    a.release()
    b.release()
    assert gate.free == 2
