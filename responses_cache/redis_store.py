"""``responses_cache.redis_store``, the documented import path of :mod:`responses_cache.storage.redis_store`.

It re-exports that module's public names (the module moved when the package was grouped by
role). Patch or extend the module itself, not this one."""

from .storage.redis_store import (
    RedisResponseStore,
    StoreUnavailable,
)

__all__ = [
    "RedisResponseStore",
    "StoreUnavailable",
]
