"""The engine slot as an async context manager: whatever way the block is left — returned,
failed, cancelled — the slot goes back, and a ``response.append`` wait holds none."""

from __future__ import annotations

import asyncio

import pytest

from responses_cache.limits.fairness import FairGate
from responses_cache.pipeline.slot import SlotLease, engine_slot


async def test_the_slot_goes_back_when_the_block_returns() -> None:
    gate = FairGate(1)
    async with SlotLease(gate, "t") as lease:
        await lease.take()
        assert lease.held and gate.free == 0
    assert not lease.held and gate.free == 1


async def test_the_slot_goes_back_when_the_block_fails() -> None:
    gate = FairGate(1)
    with pytest.raises(RuntimeError):
        async with SlotLease(gate, "t") as lease:
            await lease.take()
            raise RuntimeError("the engine failed")
    assert gate.free == 1


async def test_the_slot_goes_back_when_the_block_is_cancelled() -> None:
    gate = FairGate(1)
    inside = asyncio.Event()

    async def hold() -> None:
        async with engine_slot(gate, "t"):
            inside.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(hold())
    await inside.wait()
    assert gate.free == 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.free == 1


async def test_a_lent_slot_is_free_for_others_and_taken_again_after() -> None:
    gate = FairGate(1)
    async with SlotLease(gate, "a") as lease:
        await lease.take()
        async with lease.lent():
            assert gate.free == 1  # another turn may take it while the client runs its tools
            other = await gate.acquire("b")
            other.release()
        assert lease.held and gate.free == 0
    assert gate.free == 1


async def test_a_wait_cancelled_while_lent_takes_nothing_back() -> None:
    gate = FairGate(1)
    waiting = asyncio.Event()

    async def turn() -> None:
        async with SlotLease(gate, "a") as lease:
            await lease.take()
            async with lease.lent():
                waiting.set()
                await asyncio.Event().wait()  # the client's tools never answer

    task = asyncio.ensure_future(turn())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.free == 1


async def test_without_a_gate_nothing_is_held() -> None:
    async with engine_slot(None, "t") as lease:
        assert not lease.held
