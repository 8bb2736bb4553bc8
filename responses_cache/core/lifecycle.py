"""Starting and closing the plugins a service owns (backends, stores, billing, hooks).

A plugin that holds connections or tasks takes part by having ``async def start()`` and/or
``async def aclose()`` (as httpx clients do); plugins with neither need nothing. Its owner — a
:class:`~responses_cache.core.runtime.Service`, run by the host app's lifespan — starts them in order
and closes them in reverse order, once each, even when one of them fails to close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from enum import Enum
from typing import Protocol, runtime_checkable

logger = logging.getLogger("responses_cache.lifecycle")


@runtime_checkable
class Startable(Protocol):
    async def start(self) -> None:
        """Acquire what the plugin needs (connect, spawn its worker); called once before use."""
        ...


@runtime_checkable
class Closeable(Protocol):
    async def aclose(self) -> None:
        """Release everything the plugin holds; called once, after its last use."""
        ...


@runtime_checkable
class Stoppable(Protocol):
    """:class:`~responses_cache.billing.Biller`'s shape: ``stop()`` drains before it returns."""

    async def stop(self) -> None: ...


class Phase(Enum):
    NEW = "new"
    STARTED = "started"
    CLOSED = "closed"


class Resources:
    """The distinct plugins of one service, started and closed together."""

    def __init__(self, plugins: Iterable[object]) -> None:
        seen: dict[int, object] = {}
        for plugin in plugins:
            if plugin is not None:
                seen.setdefault(id(plugin), plugin)
        self.plugins: tuple[object, ...] = tuple(seen.values())
        self.phase = Phase.NEW
        self._lock = asyncio.Lock()
        self._started: list[object] = []

    @property
    def started(self) -> bool:
        return self.phase is Phase.STARTED

    async def start(self) -> None:
        """Start every plugin once (idempotent; concurrent callers wait for the first)."""
        if self.started:
            return  # the per-connection fast path: no lock
        async with self._lock:
            if self.phase is Phase.STARTED:
                return
            if self.phase is Phase.CLOSED:
                raise RuntimeError("this service has been closed; build a new one")
            try:
                for plugin in self.plugins:
                    if isinstance(plugin, Startable):
                        await plugin.start()
                    self._started.append(plugin)
            except BaseException:
                await self._close_started()
                self.phase = Phase.CLOSED
                raise
            self.phase = Phase.STARTED

    async def aclose(self) -> None:
        """Close what was started, in reverse order; a failure is logged and the rest still close."""
        async with self._lock:
            if self.phase is Phase.CLOSED:
                return
            self.phase = Phase.CLOSED
            await self._close_started()

    async def _close_started(self) -> None:
        while self._started:
            plugin = self._started.pop()
            try:
                if isinstance(plugin, Closeable):
                    await plugin.aclose()
                elif isinstance(plugin, Stoppable):
                    await plugin.stop()
            except Exception:
                logger.exception("closing %r failed", plugin)
