"""Placement over engine replicas: rendezvous (highest-random-weight) hashing with health.

Every replica gets a score per conversation (a hash of the affinity key and the replica's URL);
the conversation goes to the highest-scoring healthy replica. Adding a replica moves only the
conversations it now wins (about ``1/n``), removing one moves only its own, so the engines'
prefix caches stay warm. A replica that refused a connection or answered 503 is marked down for
``cooldown`` seconds and its conversations fail over to their next-ranked replica.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence


def score(key: str, member: str) -> int:
    """The rendezvous weight of ``member`` for ``key``."""
    digest = hashlib.blake2b(f"{key}\0{member}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous(key: str, members: Sequence[str]) -> list[str]:
    """``members`` ordered by their weight for ``key`` (first = owner)."""
    return sorted(members, key=lambda m: score(key, m), reverse=True)


class Replicas:
    """Engine base URLs with health. ``ranked(key)``: healthy replicas by weight, then the ones
    marked down (tried last rather than never: all may be down only briefly)."""

    def __init__(
        self, urls: Sequence[str], *, cooldown: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not urls:
            raise ValueError("at least one engine base URL is needed")
        self.urls = [u.rstrip("/") for u in urls]
        self.cooldown = cooldown
        self._clock = clock
        self._down_until: dict[str, float] = {}

    def healthy(self, url: str) -> bool:
        return self._down_until.get(url, 0.0) <= self._clock()

    def ranked(self, key: str) -> list[str]:
        order = rendezvous(key, self.urls)
        return [u for u in order if self.healthy(u)] + [u for u in order if not self.healthy(u)]

    def mark_down(self, url: str) -> None:
        self._down_until[url] = self._clock() + self.cooldown

    def mark_up(self, url: str) -> None:
        self._down_until.pop(url, None)


def data_parallel_rank(key: str, size: int) -> int:
    """A stable data-parallel rank for a conversation (rendezvous over ``range(size)``)."""
    return max(range(size), key=lambda rank: score(key, str(rank)))
