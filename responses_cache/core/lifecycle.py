"""Starting and closing the plugins a service owns (backends, stores, billing, hooks), and
draining the work in progress before a graceful stop (:class:`Drain`).

A plugin that holds connections or tasks takes part by having ``async def start()`` and/or
``async def aclose()`` (as httpx clients do); plugins with neither need nothing. Its owner — a
:class:`~responses_cache.core.runtime.Service`, run by the host app's lifespan — starts them in order
and closes them in reverse order, once each, even when one of them fails to close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class DrainListener(Protocol):
    """Something a drain tells when it starts and when its deadline passes (a WebSocket
    connection: it closes once idle, and cuts its turns at the deadline)."""

    def drain_started(self) -> None:
        """The drain began: take no new work, finish what runs, then go."""
        ...

    def drain_expired(self) -> None:
        """The deadline passed: stop what still runs (cancelled and billed, as on a disconnect)."""
        ...


class Drain:
    """A service's graceful stop: from :meth:`run` on, no new work is admitted (:attr:`draining`,
    which readiness reports first); the work in progress — tasks handed to :meth:`track`
    (HTTP turns, background responses) and watched listeners (WebSocket connections) — is
    waited for until the deadline, then told to stop (tasks cancelled, listeners
    :meth:`~DrainListener.drain_expired`). Billing is flushed by the service's close, after it.

    ::

        NOT DRAINING ──run()──▶ DRAINING ──all work done──────────▶ DONE (run returns True)
                                    └──deadline, or run cancelled──▶ EXPIRED ─▶ DONE (False)
    """

    def __init__(self) -> None:
        #: No new connections, turns or background responses are admitted.
        self.draining = False
        #: The deadline passed (or the drain was cut short) and what ran was told to stop.
        self.expired = False
        self._tasks: set[asyncio.Future[Any]] = set()
        self._listeners: dict[int, DrainListener] = {}
        self._changed = asyncio.Event()

    @property
    def busy(self) -> int:
        """Units of work the drain waits for (running tasks and open listeners)."""
        return len(self._tasks) + len(self._listeners)

    def track(self, task: asyncio.Future[Any]) -> None:
        """Wait for ``task`` in a drain; cancel it at the deadline."""
        if task.done():
            return
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        if self.expired:
            task.cancel()

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        self._changed.set()

    def watch(self, listener: DrainListener) -> Callable[[], None]:
        """Wait for ``listener`` in a drain (told at once if one has begun); the returned
        function ends the watch (call it when the listener's work is over)."""
        key = id(listener)
        self._listeners[key] = listener
        if self.draining:
            listener.drain_started()
        if self.expired:
            listener.drain_expired()

        def unwatch() -> None:
            if self._listeners.pop(key, None) is not None:
                self._changed.set()

        return unwatch

    async def run(self, deadline_s: float) -> bool:
        """Drain: ``True`` when every piece of work ended by itself within ``deadline_s``
        seconds, ``False`` when some had to be stopped (the deadline, or :meth:`expire` called
        meanwhile: a second signal). Cancelled, it stops everything at once and re-raises. A
        second call waits alongside the first."""
        if not self.draining:
            self.draining = True
            logger.info("draining: %d connection(s) and task(s) to finish within %ss", self.busy, deadline_s)
            for listener in list(self._listeners.values()):
                listener.drain_started()
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, deadline_s)
        try:
            while self.busy and not self.expired:
                left = end - loop.time()
                if left <= 0:
                    break
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), left)
            else:
                if not self.expired:
                    return True
        except asyncio.CancelledError:
            self.expire()
            raise
        if not self.expired:
            logger.warning("drain deadline (%ss) passed: stopping %d connection(s) and task(s)", deadline_s, self.busy)
        self.expire()
        return False

    def expire(self) -> None:
        """Stop what still runs now: tasks cancelled, listeners told (idempotent)."""
        self.draining = True
        if self.expired:
            return
        self.expired = True
        self._changed.set()  # a waiting run() stops waiting
        for task in list(self._tasks):
            task.cancel()
        for listener in list(self._listeners.values()):
            listener.drain_expired()

    async def settled(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the work to be gone (after :meth:`expire`: the
        cancelled turns unwinding, the connections closing)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while self.busy:
            left = end - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        return True
