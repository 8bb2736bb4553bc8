"""Fair engine access: a bounded number of engine slots, shared round-robin across tenants.

:class:`FairGate` admits at most ``slots`` generations at once (``ServerConfig.engine_slots``).
When every slot is taken, waiting turns queue per tenant, and each freed slot goes to the next
tenant in turn (round-robin over the tenants that wait), not to the oldest waiter: a tenant with
100 waiting turns gets one slot per round, as does a tenant with one. Inside a tenant, turns go
by their ``priority`` (lower first, as vLLM orders them), then in arrival order.

Sans-I/O apart from the futures it hands out; it never looks at a socket or a request.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque


class EngineSlot:
    """One held slot; :meth:`release` it once the engine call has ended (again: nothing)."""

    __slots__ = ("_gate", "held", "tenant")

    def __init__(self, gate: FairGate, tenant: str) -> None:
        self._gate = gate
        self.tenant = tenant
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._gate._release()


class FairGate:
    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"engine slots must be at least 1, not {slots}")
        self.slots = slots
        self.free = slots
        #: Waiting turns per tenant: (priority, arrival, future) heaps.
        self._waiting: dict[str, list[tuple[int, int, asyncio.Future[None]]]] = {}
        #: Tenants with waiting turns, in the order they get the next slots.
        self._ring: deque[str] = deque()
        self._arrivals = itertools.count()
        #: Slots granted, by tenant, since the gate was made (for metrics and tests).
        self.granted: dict[str, int] = {}

    @property
    def waiting(self) -> int:
        return sum(1 for queue in self._waiting.values() for _, _, f in queue if not f.done())

    async def acquire(self, tenant: str, priority: int = 0) -> EngineSlot:
        """A slot for ``tenant``: at once when one is free and nobody waits, else in its turn.
        A cancelled wait leaves the queue (a slot granted in the meantime goes to the next)."""
        if self.free > 0 and not self._ring:
            self.free -= 1
            self._count(tenant)
            return EngineSlot(self, tenant)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(tenant)
        if queue is None:
            queue = self._waiting[tenant] = []
            self._ring.append(tenant)
        heapq.heappush(queue, (priority, next(self._arrivals), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # granted, then cancelled: pass it on
                self._release()
            raise
        return EngineSlot(self, tenant)

    def _release(self) -> None:
        self.free += 1
        self._dispatch()

    def _dispatch(self) -> None:
        while self.free > 0 and self._ring:
            tenant = self._ring.popleft()
            queue = self._waiting[tenant]
            granted = False
            while queue:
                _, _, future = heapq.heappop(queue)
                if not future.done():  # a cancelled wait is skipped
                    future.set_result(None)
                    granted = True
                    break
            if queue:
                self._ring.append(tenant)  # its next turn comes after every other tenant's
            else:
                del self._waiting[tenant]
            if granted:
                self.free -= 1
                self._count(tenant)

    def _count(self, tenant: str) -> None:
        self.granted[tenant] = self.granted.get(tenant, 0) + 1
        if len(self.granted) > 100_000:  # a counter, not a registry: keep it bounded
            self.granted.clear()
