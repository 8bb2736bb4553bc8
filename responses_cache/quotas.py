"""``responses_cache.quotas``, the documented import path of :mod:`responses_cache.limits.quotas`.

It re-exports that module's public names (the module moved when the package was grouped by
role). Patch or extend the module itself, not this one."""

from .limits.quotas import (
    ALLOWED,
    CONCURRENCY_RETRY_S,
    UNLIMITED,
    Admission,
    Decision,
    Limit,
    MemoryRateLimiter,
    Quota,
    QuotaConfig,
    QuotaExceeded,
    Quotas,
    RateLimiter,
    decide,
    format_duration,
    rate_limit_headers,
)

__all__ = [
    "ALLOWED",
    "CONCURRENCY_RETRY_S",
    "UNLIMITED",
    "Admission",
    "Decision",
    "Limit",
    "MemoryRateLimiter",
    "Quota",
    "QuotaConfig",
    "QuotaExceeded",
    "Quotas",
    "RateLimiter",
    "decide",
    "format_duration",
    "rate_limit_headers",
]
