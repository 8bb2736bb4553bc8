"""The quota rules, on the in-process counters with a clock the test moves (no waiting):
requests and tokens per minute as buckets that refill continuously, tokens charged when a turn
ends (the bucket may go below zero, and while it is new turns are refused), concurrent responses
and open connections counted exactly, and OpenAI's header formats."""

from __future__ import annotations

import pytest

from responses_cache.limits.quotas import (
    MemoryRateLimiter,
    Quota,
    QuotaConfig,
    QuotaExceeded,
    Quotas,
    format_duration,
    rate_limit_headers,
)
from responses_cache.testing import LogicalClock


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.012, "12ms"), (0.0001, "1ms"), (1, "1s"), (1.5, "1.5s"), (17.28, "17.28s"), (360, "6m0s"),
     (76.8, "1m16.8s"), (3723, "1h2m3s")],
)
def test_durations_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


async def test_requests_per_minute_refill_continuously() -> None:
    clock = LogicalClock(1000.0)
    quotas = Quotas(QuotaConfig(Quota(requests_per_minute=3)), MemoryRateLimiter(clock=clock))
    for left in (2, 1, 0):
        admission = await quotas.admit("t", "l")
        assert admission.decision.remaining_requests == left
        admission.release()
    with pytest.raises(QuotaExceeded) as refused:
        await quotas.admit("t", "l")
    decision = refused.value.decision
    assert decision.refused_by == "requests" and decision.retry_after_s == pytest.approx(20.0)
    assert refused.value.status == 429 and refused.value.code == "rate_limit_exceeded"
    assert refused.value.headers is not None and refused.value.headers["retry-after"] == "20"
    clock.now += 19.9
    with pytest.raises(QuotaExceeded):
        await quotas.admit("t", "l")
    clock.now += 0.1
    (await quotas.admit("t", "l")).release()
    assert (await quotas.admit("other", "l")).decision.remaining_requests == 2  # tenants apart


async def test_tokens_are_charged_when_the_turn_ends_and_debt_refuses_until_paid() -> None:
    clock = LogicalClock(1000.0)
    limiter = MemoryRateLimiter(clock=clock)
    quotas = Quotas(QuotaConfig(Quota(tokens_per_minute=600)), limiter)
    first = await quotas.admit("t", "a")
    second = await quotas.admit("t", "b")  # admitted while the first runs: nothing charged yet
    first.release(500)
    second.release(400)  # 600 - 900: 300 in debt
    status = await quotas.status("t")
    assert status.remaining_tokens == 0 and status.reset_tokens_s == pytest.approx(90.0)
    with pytest.raises(QuotaExceeded) as refused:
        await quotas.admit("t", "c")
    assert refused.value.decision.refused_by == "tokens"
    assert refused.value.decision.retry_after_s == pytest.approx(30.0)  # 300 tokens at 10 per second
    clock.now += 30.0
    admission = await quotas.admit("t", "c")
    assert admission.decision.remaining_tokens == 0
    admission.release(0)
    clock.now += 60.0
    assert (await quotas.status("t")).remaining_tokens == 600  # never above the limit


async def test_release_charges_once() -> None:
    clock = LogicalClock(1000.0)
    quotas = Quotas(QuotaConfig(Quota(tokens_per_minute=600, concurrent_responses=1)), MemoryRateLimiter(clock=clock))
    admission = await quotas.admit("t", "a")
    admission.release(100)
    admission.release(100)
    assert (await quotas.status("t")).remaining_tokens == 500
    (await quotas.admit("t", "b")).release()  # the slot was freed once, not twice


async def test_concurrent_responses_are_counted_exactly() -> None:
    limiter = MemoryRateLimiter(clock=LogicalClock(1000.0))
    quotas = Quotas(QuotaConfig(Quota(concurrent_responses=2)), limiter)
    a, b = await quotas.admit("t", "a"), await quotas.admit("t", "b")
    with pytest.raises(QuotaExceeded) as refused:
        await quotas.admit("t", "c")
    assert refused.value.decision.refused_by == "concurrent_responses"
    assert limiter.running("t") == 2
    a.release()
    c = await quotas.admit("t", "c")
    b.release()
    c.release()
    assert limiter.running("t") == 0


async def test_connections_are_counted_exactly() -> None:
    limiter = MemoryRateLimiter(clock=LogicalClock(1000.0))
    quotas = Quotas(QuotaConfig(Quota(connections=1), {"vip": Quota()}), limiter)
    await quotas.connect("t", "c1")
    with pytest.raises(QuotaExceeded) as refused:
        await quotas.connect("t", "c2")
    assert refused.value.decision.refused_by == "connections"
    await quotas.connect("vip", "c1")
    await quotas.connect("vip", "c2")  # its own entry: no limit
    quotas.disconnect("t", "c1")
    await quotas.connect("t", "c2")
    assert limiter.connections("t") == 1


async def test_a_peek_counts_nothing() -> None:
    quotas = Quotas(QuotaConfig(Quota(requests_per_minute=1)), MemoryRateLimiter(clock=LogicalClock(1000.0)))
    for _ in range(3):
        assert (await quotas.status("t")).remaining_requests == 1
    (await quotas.admit("t", "a")).release()


def test_headers_carry_every_limit_and_the_retry_time() -> None:
    quota = Quota(requests_per_minute=60, tokens_per_minute=6000)
    limiter = MemoryRateLimiter(clock=LogicalClock(1000.0))
    decision = limiter.admit_now("t", quota)
    assert rate_limit_headers(decision) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "6000",
        "x-ratelimit-remaining-tokens": "6000",
        "x-ratelimit-reset-tokens": "0s",
    }


def test_a_quota_must_be_positive() -> None:
    with pytest.raises(ValueError, match="requests_per_minute"):
        Quota(requests_per_minute=0)
