"""The input rate budgets, counted on a logical clock: in every span of time a connection, and a
tenant's connections together, are taken no more than ``burst + rate * t`` bytes plus one frame,
and no less than the budget allows (the limit does not starve a client that keeps to it)."""

from __future__ import annotations

import pytest

from responses_cache.limits.input_rate import ConnectionInput, InputRate, InputRateLimits
from responses_cache.testing import LogicalClock

MIB = 1024 * 1024
TICK = 0.01  # one logical tick, seconds



def _flood(connections: list[ConnectionInput], clock: LogicalClock, frame: int, ticks: int) -> list[int]:
    """Every connection takes a frame whenever its budgets allow, tick after tick; the bytes taken
    by all of them together, after each tick."""
    taken, totals = 0, []
    for _ in range(ticks):
        for connection in connections:
            for _ in range(1000):  # a broken budget must not loop forever
                if connection.wait() > 0:
                    break
                connection.charge(frame)
                taken += frame
        totals.append(taken)
        clock.now += TICK
    return totals


def _within(totals: list[int], rate: float, burst: int, frame: int) -> None:
    for tick, taken in enumerate(totals):
        elapsed = tick * TICK
        assert taken <= burst + rate * elapsed + frame, f"tick {tick}: {taken} bytes taken"
        assert taken >= burst + rate * elapsed - frame, f"tick {tick}: only {taken} bytes taken"


def test_a_flooding_connection_is_taken_no_faster_than_its_budget() -> None:
    clock = LogicalClock()
    rate = InputRate(InputRateLimits(connection_bytes_per_s=MIB, connection_burst_bytes=4 * MIB, tenant_bytes_per_s=None), clock=clock)
    frame = 100_000
    _within(_flood([rate.open("a")], clock, frame, ticks=500), MIB, 4 * MIB, frame)


def test_a_tenants_connections_share_its_budget_and_other_tenants_are_not_slowed() -> None:
    clock = LogicalClock()
    limits = InputRateLimits(connection_bytes_per_s=MIB, connection_burst_bytes=MIB, tenant_bytes_per_s=MIB, tenant_burst_bytes=2 * MIB)
    rate = InputRate(limits, clock=clock)
    frame = 50_000
    noisy = [rate.open("noisy") for _ in range(4)]  # four connections: 4 MiB/s on their own budgets
    _within(_flood(noisy, clock, frame, ticks=300), MIB, 2 * MIB, frame)
    # The noisy tenant is in debt now; a connection of another tenant is taken at once.
    quiet = rate.open("quiet")
    assert all(c.wait() > 0 for c in noisy) and quiet.wait() == 0


def test_reconnecting_does_not_reset_a_tenants_budget() -> None:
    clock = LogicalClock()
    rate = InputRate(InputRateLimits(tenant_bytes_per_s=MIB, tenant_burst_bytes=MIB), clock=clock)
    first = rate.open("t")
    first.charge(3 * MIB)
    first.close()
    again = rate.open("t")
    assert again.wait() == pytest.approx(2.0)  # still 2 MiB in debt at 1 MiB/s
    again.close()


def test_idle_tenants_are_forgotten_once_their_budget_has_refilled() -> None:
    clock = LogicalClock()
    rate = InputRate(InputRateLimits(tenant_bytes_per_s=MIB, tenant_burst_bytes=MIB), clock=clock)
    for i in range(100):
        connection = rate.open(f"tenant-{i}")
        connection.charge(MIB // 2)
        connection.close()
    assert rate.tenants == 100  # half-empty buckets are kept (a reconnect would reset them)
    clock.now += 1.0
    rate.open("another").close()
    assert rate.tenants == 1


async def test_admit_waits_until_the_budget_is_out_of_debt_then_charges() -> None:
    clock = LogicalClock()
    rate = InputRate(
        InputRateLimits(connection_bytes_per_s=MIB, connection_burst_bytes=MIB, tenant_bytes_per_s=None),
        clock=clock, sleep=clock.sleep,
    )
    connection = rate.open("t")
    await connection.admit(3 * MIB)  # a full bucket takes a frame larger than its burst...
    assert clock.now == 0 and clock.slept == []
    await connection.admit(10)  # ...and the next frame waits for the 2 MiB of debt
    assert clock.now == pytest.approx(2.0) and rate.admitted == 3 * MIB + 10


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="connection_bytes_per_s"):
        InputRateLimits(connection_bytes_per_s=0)
    with pytest.raises(ValueError, match="tenant_burst_bytes"):
        InputRateLimits(tenant_burst_bytes=-1)
    off = InputRate(InputRateLimits(connection_bytes_per_s=None, tenant_bytes_per_s=None)).open("t")
    off.charge(10**12)
    assert off.wait() == 0
