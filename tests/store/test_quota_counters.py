"""The quota counters in Redis follow the same rules as the in-process ones (one scenario, both
limiters, the same decisions), hold across processes (two limiters on one Redis), cost one round
trip per turn (charges travel with the next admission or in one pipelined batch), keep a tenant's
keys in one cluster slot, and let a dead process's slots expire."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.crc import key_slot

from responses_cache.limits.quotas import Decision, MemoryRateLimiter, Quota
from responses_cache.limits.redis_quotas import RedisRateLimiter
from responses_cache.testing import LogicalClock


@pytest.fixture
async def shared(redis_url: str) -> AsyncIterator[tuple[RedisRateLimiter, RedisRateLimiter, LogicalClock]]:
    """Two limiters on one Redis, as two server processes have, with one clock."""
    clock = LogicalClock(1_700_000_000.0)
    one = RedisRateLimiter(redis_url, clock=clock, flush_s=3600)  # flushed by hand in these tests
    two = RedisRateLimiter(redis_url, clock=clock, flush_s=3600)
    yield one, two, clock
    await one.aclose()
    await two.aclose()


def _view(d: Decision) -> tuple[Any, ...]:
    return (d.allowed, d.refused_by, round(d.retry_after_s, 3), d.remaining_requests, d.remaining_tokens,
            round(d.reset_requests_s, 3), round(d.reset_tokens_s, 3))


async def _scenario(limiter: Any, clock: LogicalClock) -> list[tuple[Any, ...]]:
    quota = Quota(requests_per_minute=4, tokens_per_minute=1200, concurrent_responses=2)
    out = []
    for step in range(14):
        decision = await limiter.admit("t", quota, f"r{step}")
        out.append(_view(decision))
        if decision.allowed:
            limiter.finish("t", quota, f"r{step}", 250 * (step % 4))
        if isinstance(limiter, RedisRateLimiter):
            await limiter.flush()
        clock.now += 3.5
    out.append(_view(await limiter.peek("t", quota)))
    return out


async def test_redis_decides_as_the_process_does(shared: tuple[RedisRateLimiter, RedisRateLimiter, LogicalClock]) -> None:
    one, _, clock = shared
    start = clock.now
    in_redis = await _scenario(one, clock)
    clock.now = start
    here = await _scenario(MemoryRateLimiter(clock=clock), clock)
    assert in_redis == here
    assert {v[1] for v in here} >= {None, "requests", "tokens"}  # the scenario meets the limits


async def test_limits_hold_across_processes(shared: tuple[RedisRateLimiter, RedisRateLimiter, LogicalClock]) -> None:
    one, two, _ = shared
    quota = Quota(requests_per_minute=3, concurrent_responses=2)
    assert (await one.admit("t", quota, "a")).allowed
    assert (await two.admit("t", quota, "b")).allowed
    third = await one.admit("t", quota, "c")
    assert third.refused_by == "concurrent_responses"
    two.finish("t", quota, "b", 0)  # waits in process two until its next call or flush
    assert (await one.admit("t", quota, "c")).refused_by == "concurrent_responses"
    await two.flush()
    assert (await one.admit("t", quota, "c")).allowed
    assert (await two.admit("t", quota, "d")).refused_by == "requests"  # 3 a minute, both processes


async def test_tokens_charged_in_one_process_refuse_in_the_other(
    shared: tuple[RedisRateLimiter, RedisRateLimiter, LogicalClock],
) -> None:
    one, two, _ = shared
    quota = Quota(tokens_per_minute=1000)
    assert (await one.admit("t", quota, "a")).allowed
    one.finish("t", quota, "a", 1500)
    await one.flush()
    refused = await two.admit("t", quota, "b")
    assert refused.refused_by == "tokens" and refused.retry_after_s == pytest.approx(30.0)


async def test_one_round_trip_per_turn(shared: tuple[RedisRateLimiter, RedisRateLimiter, LogicalClock]) -> None:
    one, _, _ = shared
    quota = Quota(requests_per_minute=10_000, tokens_per_minute=10_000_000, concurrent_responses=100)
    before = one.round_trips
    for turn in range(50):
        decision = await one.admit("t", quota, f"r{turn}")
        assert decision.allowed
        assert decision.remaining_tokens == 10_000_000 - turn * 100  # the previous turns' charges arrived with it
        one.finish("t", quota, f"r{turn}", 100)  # travels with the next admission
    assert one.round_trips - before == 50
    for tenant in range(20):
        one.finish(f"t{tenant}", quota, "x", 10)
    await one.flush()  # every tenant's charge in one pipelined batch
    assert one.round_trips - before == 51 and one.pending == 0
    status = await one.peek("t", quota)
    assert status.remaining_tokens == 10_000_000 - 50 * 100
    assert status.remaining_requests == 10_000 - 50


async def test_charges_flush_on_their_own(redis_url: str) -> None:
    limiter = RedisRateLimiter(redis_url, flush_s=0.001)
    quota = Quota(tokens_per_minute=1000)
    try:
        assert (await limiter.admit("t", quota, "a")).allowed
        limiter.finish("t", quota, "a", 400)
        assert limiter._flusher is not None
        await limiter._flusher  # ends once nothing is left to send
        assert limiter.pending == 0
        other = RedisRateLimiter(redis_url)
        assert (await other.peek("t", quota)).remaining_tokens in (600, 601)  # refilled a little meanwhile
        await other.aclose()
    finally:
        await limiter.aclose()


async def test_a_dead_process_slots_expire(shared: tuple[RedisRateLimiter, RedisRateLimiter, LogicalClock]) -> None:
    one, two, clock = shared
    quota = Quota(concurrent_responses=1, connections=1)
    assert (await one.admit("t", quota, "a")).allowed  # process one dies holding both
    assert (await one.connect("t", quota, "c")).allowed
    assert (await two.admit("t", quota, "b")).refused_by == "concurrent_responses"
    assert (await two.connect("t", quota, "d")).refused_by == "connections"
    clock.now += one.response_lease_s + 1
    assert (await two.admit("t", quota, "b")).allowed
    clock.now += one.connection_lease_s
    assert (await two.connect("t", quota, "d")).allowed


async def test_a_tenant_keys_share_one_cluster_slot(redis_url: str) -> None:
    limiter = RedisRateLimiter(redis_url)
    try:
        keys = limiter.keys_of("tenant with spaces {and braces}")
        tags = {key[key.index("{") + 1 : key.index("}")] for key in keys}
        assert len(keys) == 3 and len(tags) == 1
        assert len({key_slot(k.encode()) for k in keys}) == 1
    finally:
        await limiter.aclose()


async def test_redis_unreachable_admits_and_keeps_the_charges() -> None:
    limiter = RedisRateLimiter("redis://127.0.0.1:1/0", flush_s=3600)
    quota = Quota(requests_per_minute=1, tokens_per_minute=10)
    try:
        assert (await limiter.admit("t", quota, "a")).allowed
        limiter.finish("t", quota, "a", 50)
        await limiter.flush()
        assert limiter.errors == 2 and limiter.pending == 1  # kept for later
    finally:
        limiter._pending.clear()
        await limiter.aclose()
