"""The process-wide hot cache: the latest states of ``store: true`` conversations, shared by HTTP
and WebSocket, so that a continuation on the process that holds the state appends to its token
log whichever transport or connection carries it.

It sits between the connection caches and the durable store. Entries are keyed by
``(tenant, response_id)``, bounded in bytes (the same size measure as the connection caches), and
live no longer than the store keeps the response (``ttl_s``): the cache never answers for a
response the store has already forgotten. Only ``store: true`` responses enter it, so it never
makes a ``store: false`` response reachable from outside its connection.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from cachetools import TTLCache

from .state import ResponseState


def state_bytes(state: ResponseState) -> int:
    """Approximate bytes a cached state holds (items plus 4 bytes a token of its log)."""
    log = state.token_log
    return max(1, state.total_bytes + (4 * log.num_tokens if log is not None else 0))


class HotCache:
    def __init__(
        self, max_bytes: int, *, ttl_s: float | None = None, timer: Callable[[], float] = time.monotonic
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self._data: TTLCache[tuple[str, str], ResponseState] = TTLCache(
            maxsize=max_bytes, ttl=ttl_s if ttl_s is not None else math.inf, timer=timer, getsizeof=state_bytes
        )
        self.hits = 0
        self.misses = 0

    def get(self, tenant: str, response_id: str) -> ResponseState | None:
        state = self._data.get((tenant, response_id))
        if state is None:
            self.misses += 1
        else:
            self.hits += 1
        return state

    def put(self, state: ResponseState) -> None:
        """Keep a finished ``store: true`` state (a state larger than the whole cache is skipped)."""
        if not state.store or state.response.status == "failed":
            return
        if state_bytes(state) > self._data.maxsize:
            return
        self._data[(state.tenant, state.id)] = state

    def evict(self, tenant: str, response_id: str) -> None:
        self._data.pop((tenant, response_id), None)

    @property
    def total_bytes(self) -> int:
        return int(self._data.currsize)

    def __len__(self) -> int:
        return len(self._data)
