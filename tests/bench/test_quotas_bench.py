"""``benchmarks/quotas.py`` at a small size: the token-rate simulation runs the real quota stage
under a simulated clock, so its accuracy is a count, not a timing, and can be asserted."""

from __future__ import annotations

from benchmarks.quotas import rate_accuracy, stage_overhead


async def test_the_token_rate_holds_within_one_percent() -> None:
    result = await rate_accuracy(tenants=50, connections=4, tpm=60_000, seconds=900.0, seed=3)
    assert result["refusals"] > result["turns"] / 2  # the limit binds: connections want far more
    assert result["total_error_pct"] < 1.0
    assert result["tenant_error_pct_max"] < 2.0


async def test_the_overhead_measurement_runs() -> None:
    assert (await stage_overhead(tenants=10, turns=100))["admit_release_us"] > 0
