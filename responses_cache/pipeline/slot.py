"""A turn's engine slot (:class:`~responses_cache.limits.fairness.FairGate`) as an async context manager.

``async with SlotLease(gate, tenant, priority) as lease:`` scopes the slot: :meth:`SlotLease.take`
waits for one (in the tenant's turn; a no-op without a gate), and whatever way the block is left
— returned, failed, cancelled — the slot held then goes back. :meth:`SlotLease.lent` gives it back
for a wait that needs no engine (a ``response.append`` round's client tools) and takes one again
after. No release is written by hand anywhere else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType

from ..limits.fairness import EngineSlot, FairGate


class SlotLease:
    __slots__ = ("_gate", "_priority", "_slot", "_tenant")

    def __init__(self, gate: FairGate | None, tenant: str, priority: int = 0) -> None:
        self._gate = gate
        self._tenant = tenant
        self._priority = priority
        self._slot: EngineSlot | None = None

    @property
    def held(self) -> bool:
        return self._slot is not None and self._slot.held

    async def take(self) -> None:
        """Wait for a free engine slot in the tenant's turn (at once without a gate)."""
        if self._gate is not None:
            self._slot = await self._gate.acquire(self._tenant, self._priority)

    def _give_back(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    @asynccontextmanager
    async def lent(self) -> AsyncIterator[None]:
        """No slot is held while the block runs; one is taken again once it has returned (a block
        that fails or is cancelled takes none: the lease's end has nothing to give back)."""
        self._give_back()
        yield
        await self.take()

    async def __aenter__(self) -> SlotLease:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._give_back()


@asynccontextmanager
async def engine_slot(gate: FairGate | None, tenant: str, priority: int = 0) -> AsyncIterator[SlotLease]:
    """A slot taken on entry and given back on exit (a compaction's one engine call)."""
    async with SlotLease(gate, tenant, priority) as lease:
        await lease.take()
        yield lease
