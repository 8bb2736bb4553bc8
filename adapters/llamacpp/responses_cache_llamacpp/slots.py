"""Where a conversation runs: its replica (rendezvous hashing with health) and its slot there.

``llama-server`` keeps one prompt cache per slot (``--parallel N``) and reuses the longest common
prefix of the slot's last prompt and the next one. A conversation that lands on another slot than
its previous turn's prefills its whole history again, and pushes out what that slot held. So:

* :class:`Replicas` ranks the servers per conversation (highest-random-weight hashing of the
  affinity key: adding or removing a server moves only the conversations it wins or held); a
  server that refused a connection or answered 502/503/504 is tried last for ``cooldown`` seconds.
* :class:`SlotTable` keeps, per server, which conversation owns which slot: a conversation keeps
  its slot for as long as it is among the ``size`` most recently active ones; a new conversation
  takes a free slot, else the slot of the least recently active conversation that is not
  generating (else the least recently active one: the server queues the request until the slot
  is free).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence


def _score(key: str, member: str) -> int:
    digest = hashlib.blake2b(f"{key}\0{member}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Replicas:
    """Server base URLs with health. ``ranked(key)``: the healthy ones by weight for ``key``, then
    those marked down (tried last rather than never: all may be down only briefly)."""

    def __init__(
        self, urls: Sequence[str], *, cooldown: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not urls:
            raise ValueError("at least one llama-server base URL is needed")
        self.urls = [u.rstrip("/") for u in urls]
        self.cooldown = cooldown
        self._clock = clock
        self._down_until: dict[str, float] = {}

    def healthy(self, url: str) -> bool:
        return self._down_until.get(url, 0.0) <= self._clock()

    def ranked(self, key: str) -> list[str]:
        order = sorted(self.urls, key=lambda url: _score(key, url), reverse=True)
        return [u for u in order if self.healthy(u)] + [u for u in order if not self.healthy(u)]

    def mark_down(self, url: str) -> None:
        self._down_until[url] = self._clock() + self.cooldown

    def mark_up(self, url: str) -> None:
        self._down_until.pop(url, None)


class SlotTable:
    """Conversations (affinity keys) -> slot ids of one server with ``size`` slots.

    ``acquire(key)`` before a generation, ``release(slot)`` after it (in a ``finally``)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a server has at least one slot")
        self.size = size
        self._owners: OrderedDict[str, int] = OrderedDict()  # least recently active first
        self._running = [0] * size  # generations in flight per slot

    def acquire(self, key: str) -> int:
        slot = self._owners.get(key)
        if slot is None:
            slot = self._free() if len(self._owners) < self.size else self._evict()
            self._owners[key] = slot
        self._owners.move_to_end(key)
        self._running[slot] += 1
        return slot

    def release(self, slot: int) -> None:
        self._running[slot] = max(0, self._running[slot] - 1)

    def slot_of(self, key: str) -> int | None:
        return self._owners.get(key)

    def _free(self) -> int:
        taken = set(self._owners.values())
        return next(slot for slot in range(self.size) if slot not in taken)

    def _evict(self) -> int:
        victim = next((k for k, s in self._owners.items() if self._running[s] == 0), None)
        if victim is None:
            victim = next(iter(self._owners))
        return self._owners.pop(victim)
