"""Small statistics helpers (percentiles without numpy) and history buckets."""

from __future__ import annotations

import math
from collections.abc import Sequence

#: History buckets (prompt tokens) for the overhead benchmark: lower bounds and labels.
BUCKETS: tuple[tuple[int, str], ...] = (
    (0, "<8k"),
    (8_000, "8k-16k"),
    (16_000, "16k-32k"),
    (32_000, "32k-64k"),
    (64_000, "64k-100k"),
    (100_000, ">=100k"),
)


def bucket_of(tokens: int) -> str:
    label = BUCKETS[0][1]
    for low, name in BUCKETS:
        if tokens >= low:
            label = name
    return label


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def p50(values: Sequence[float]) -> float:
    return percentile(values, 50)


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) and not math.isnan(b) else math.nan
