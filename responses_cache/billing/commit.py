"""Group commit of the usage journal (``durability="machine"``).

A turn that needs its journal line on disk before an event goes out awaits
:meth:`GroupCommit.after`. One thread runs ``fdatasync`` at most every ``commit_interval`` seconds,
so that the appends of every turn in that interval share one sync, and then resolves the waiters
whose lines it covered, on their event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterable

from .journal import UsageJournal

logger = logging.getLogger("responses_cache.billing")


class GroupCommit:
    """Syncs ``journal`` for the awaiters of :meth:`after`, on one thread started by :meth:`start`
    (on the event loop that awaits) and ended by :meth:`stop`."""

    def __init__(self, journal: UsageJournal, commit_interval: float) -> None:
        self._journal = journal
        self._interval = commit_interval
        self._lock = threading.Lock()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._needed = threading.Event()
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the sync thread; :meth:`after` hands out futures of the running loop."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name="responses_cache.billing.sync", daemon=True)
        self._thread.start()

    def after(self, end: int) -> asyncio.Future[None] | None:
        """A future resolved once the journal is synced up to byte ``end``; None on another
        thread than the loop's (it has no loop future to await: the sync comes soon all the same),
        and before :meth:`start`."""
        if self._thread is None:
            return None
        loop = self._loop
        if loop is None or threading.get_ident() != self._loop_thread:
            self._needed.set()
            return None
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiters.append((end, future))
        self._needed.set()
        return future

    async def stop(self) -> None:
        """A last sync for anyone still waiting, then the thread ends; every waiter is resolved."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        self._needed.set()
        await asyncio.to_thread(thread.join)

    def _run(self) -> None:
        journal = self._journal
        last = 0.0
        while True:
            self._needed.wait()
            if self._stopping.is_set():
                with contextlib.suppress(Exception):
                    journal.sync()  # a last commit for anyone still waiting
                break
            self._needed.clear()
            wait = last + self._interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # let more appends join this commit
            last = time.monotonic()
            try:
                synced = journal.sync()
            except Exception:
                # The bytes are written (they survive a kill of the process); a turn must not
                # hang on a disk that cannot sync, so the waiters are released and it is logged.
                logger.exception("fdatasync of the billing journal %s failed", journal.path)
                synced = journal.appended
            self._release(synced)
        self._release(None)

    def _release(self, synced: int | None) -> None:
        """Resolve the waiters up to ``synced`` (all of them: None)."""
        with self._lock:
            ready = [f for end, f in self._waiters if synced is None or end <= synced]
            self._waiters = [(e, f) for e, f in self._waiters if synced is not None and e > synced]
        if not ready:
            return
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(resolve, ready)


def resolve(waiters: Iterable[asyncio.Future[None]]) -> None:
    """Resolve each of ``waiters`` not yet done."""
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
