"""``responses_cache.redis_quotas``, the documented import path of :mod:`responses_cache.limits.redis_quotas`.

It re-exports that module's public names (the module moved when the package was grouped by
role). Patch or extend the module itself, not this one."""

from .limits.redis_quotas import (
    RedisRateLimiter,
)

__all__ = [
    "RedisRateLimiter",
]
