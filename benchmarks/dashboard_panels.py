"""The panels of ``docs/grafana-dashboard.json``, in one place: :mod:`benchmarks.dashboard` writes
the Grafana JSON from them and draws the same panels from scraped ``/metrics`` snapshots."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Query:
    #: PromQL over the ``responses_cache_*`` metrics (``$__rate_interval`` is Grafana's).
    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    unit: str  # Grafana's unit id: "s", "short", "reqps"
    queries: tuple[Query, ...]
    stacked: bool = False
    description: str = ""


R = "$__rate_interval"


def _quantiles(metric: str) -> tuple[Query, ...]:
    return tuple(
        Query(f"histogram_quantile({q}, sum by (le) (rate(responses_cache_{metric}_bucket[{R}])))", f"p{int(q * 100)}")
        for q in (0.5, 0.95, 0.99)
    )


PANELS = (
    Panel(
        "Turns per second by status", "reqps",
        tuple(
            Query(f"sum(rate(responses_cache_responses_{s}_total[{R}]))", s)
            for s in ("completed", "incomplete", "failed", "cancelled")
        ),
        stacked=True,
    ),
    Panel(
        "Time to first token", "s", _quantiles("time_to_first_token_seconds"),
        description="From the turn's arrival to the engine's first token.",
    ),
    Panel(
        "Per-turn overhead", "s", _quantiles("turn_overhead_seconds"),
        description="The turn's wall time outside the engine call: validate, hooks, render, journal, store.",
    ),
    Panel(
        "Where each turn's parent came from", "reqps",
        (Query(f"sum by (tier) (rate(responses_cache_parent_tier_total[{R}]))", "{{tier}}"),),
        stacked=True,
        description="connection cache, full-input match, hot tier, store snapshot, full store render, or none (first turn).",
    ),
    Panel(
        "Tokens per turn: rendered vs reused", "short",
        (
            Query(f"sum(rate(responses_cache_rendered_tokens_sum[{R}])) / sum(rate(responses_cache_rendered_tokens_count[{R}]))", "rendered"),
            Query(f"sum(rate(responses_cache_cached_tokens_total[{R}])) / sum(rate(responses_cache_rendered_tokens_count[{R}]))", "reused"),
        ),
    ),
    Panel(
        "Mean time per stage", "s",
        (Query(f"sum by (stage) (rate(responses_cache_stage_seconds_sum[{R}])) / sum by (stage) (rate(responses_cache_stage_seconds_count[{R}]))", "{{stage}}"),),
    ),
    Panel(
        "Billing lag", "s", _quantiles("billing_lag_seconds"),
        description="From a response's end to its usage record's delivery to the billing sink.",
    ),
    Panel(
        "Render path", "reqps",
        (
            Query(f"sum(rate(responses_cache_render_incremental_total[{R}]))", "incremental (appended)"),
            Query(f"sum(rate(responses_cache_render_full_total[{R}]))", "full render"),
        ),
        stacked=True,
    ),
)
