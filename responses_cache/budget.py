"""A process-wide budget for connection caches: least recently used connections give way.

Each connection's cache is bounded by its :class:`~responses_cache.session.SessionConfig`; this
bounds their sum. After every turn the connection reports its cache size; when the total passes
``max_bytes``, the caches of the least recently active connections are dropped (a later
continuation on such a connection hydrates from the store, or gets ``previous_response_not_found``
with ``store: false``). Busy connections are touched at the end of each turn, so the ones that
give way are the idle ones.
"""

from __future__ import annotations

from cachetools import LRUCache

from .session import Session


class _Ledger(LRUCache[int, int]):
    """Bytes per connection, in recency order; eviction clears that connection's cache."""

    def __init__(self, max_bytes: int, sessions: dict[int, Session]) -> None:
        super().__init__(maxsize=max_bytes, getsizeof=lambda size: max(size, 1))
        self.sessions = sessions
        self.evictions = 0

    def popitem(self) -> tuple[int, int]:
        key, size = super().popitem()
        session = self.sessions.get(key)
        if session is not None:
            session.cache.clear()
            session.items.clear()
            self.evictions += 1
        return key, size


class CacheBudget:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self._sessions: dict[int, Session] = {}
        self._ledger = _Ledger(max_bytes, self._sessions)

    def touch(self, session: Session) -> None:
        """Record ``session``'s current cache size and mark it most recently used."""
        key = id(session)
        self._sessions[key] = session
        size = session.cache.size()[1] + session.items.nbytes
        self._ledger.pop(key, None)
        if size > self._ledger.maxsize:  # alone over the budget: it cannot be kept at all
            session.cache.clear()
            session.items.clear()
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

    @property
    def evictions(self) -> int:
        return self._ledger.evictions

    def __len__(self) -> int:
        return len(self._ledger)
