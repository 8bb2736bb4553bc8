"""A process-wide budget for connection caches: least recently used connections give way.

Each connection's cache is bounded by its :class:`~responses_cache.session.session.SessionConfig`; this
bounds their sum. After every turn the connection reports its cache size; when the total passes
``max_bytes``, the caches of the least recently active connections are dropped (a later
continuation on such a connection hydrates from the store, or gets ``previous_response_not_found``
with ``store: false``). Busy connections are touched at the end of each turn, so the ones that
give way are the idle ones.

The budget keeps only the ledger (bytes per connection, in recency order); a connection's cache
is its session's, and the budget asks the session to give it up (:meth:`Session.drop_cache`).
Each cache it drops counts in ``cache_budget_evictions_total``.
"""

from __future__ import annotations

from collections.abc import Callable

from cachetools import LRUCache

from ..observability.metrics import Metrics, NullMetrics
from .session import Session


class _Ledger(LRUCache[int, int]):
    """Bytes per connection, in recency order; an entry pushed out is handed to ``evicted``."""

    def __init__(self, max_bytes: int, evicted: Callable[[int], None]) -> None:
        super().__init__(maxsize=max_bytes, getsizeof=lambda size: max(size, 1))
        self._evicted = evicted

    def popitem(self) -> tuple[int, int]:
        key, size = super().popitem()
        self._evicted(key)
        return key, size


class CacheBudget:
    def __init__(self, max_bytes: int, metrics: Metrics | None = None) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self._sessions: dict[int, Session] = {}
        self._ledger = _Ledger(max_bytes, self._evict)
        self._metrics: Metrics = metrics if metrics is not None else NullMetrics()

    def touch(self, session: Session) -> None:
        """Record ``session``'s current cache size and mark it most recently used."""
        key = id(session)
        self._sessions[key] = session
        size = session.cached_bytes
        self._ledger.pop(key, None)
        if size > self._ledger.maxsize:  # alone over the budget: it cannot be kept at all
            session.drop_cache()
            return
        self._ledger[key] = size

    def forget(self, session: Session) -> None:
        """The connection closed."""
        key = id(session)
        self._ledger.pop(key, None)
        self._sessions.pop(key, None)

    @property
    def total_bytes(self) -> int:
        return int(self._ledger.currsize)

    def __len__(self) -> int:
        return len(self._ledger)

    def _evict(self, key: int) -> None:
        """The ledger let the least recently used connection go: it drops its cache."""
        session = self._sessions.get(key)
        if session is not None:
            session.drop_cache()
            self._metrics.inc("cache_budget_evictions_total")
