"""The Biller: a write-ahead usage journal on the turn's path, delivery to the sink off it.

The turn tells the Biller three things about each response, each a plain synchronous call that
appends one line to the :class:`~responses_cache.billing.journal.UsageJournal`:

* :meth:`Biller.begin` when the response is created (before ``response.created`` goes out),
* :meth:`Biller.progress` as output items end (progress marks),
* :meth:`Biller.end` with the final :class:`UsageRecord` (before the terminal event goes out).

One background worker reads closed records from the journal, writes them to the
:class:`~responses_cache.billing.BillingSink` in batches and checkpoints each accepted batch
(``ack``). A record therefore never waits only in memory: a slow or failing sink just leaves
it in the journal, where the next process finds it after a crash. Billing overlaps the next
turn instead of delaying this one.

Durability (``durability=``):

* ``"process"``: each append is an ``os.write`` before the event goes out; it survives a kill
  of the process (the kernel has the bytes). No ``fsync`` on the turn's path.
* ``"machine"``: additionally, a group commit thread (:mod:`.commit`) runs ``fdatasync`` at most
  every ``commit_interval`` seconds, and ``begin``/``end`` return an awaitable that the turn
  awaits before sending ``response.created`` / the terminal event; it survives power loss.

Without a journal (``journal_path=None``) the Biller keeps undelivered records in memory:
they survive sink outages while the process lives, not a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Awaitable, Iterable
from types import TracebackType
from typing import Final, Literal

import msgspec

from ..observability.metrics import Metrics
from .commit import GroupCommit, resolve
from .journal import Durability, MarkEntry, OpenEntry, UsageJournal
from .record import UsageRecord, encode_record
from .sinks import BillingSink

__all__ = ["Biller", "BillerStats"]

logger = logging.getLogger("responses_cache.billing")

_State = Literal["new", "starting", "running", "stopping", "stopped"]


class _Default:
    pass


_DEFAULT: Final = _Default()
_MEMORY_WARN_EVERY: Final = 60.0  # seconds between "records held in memory" warnings


class BillerStats(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a :class:`Biller`'s counters."""

    submitted: int
    """Records ended (``end()``/``submit()``) on this Biller."""
    delivered: int
    """Records accepted by the sink (including ones replayed from an earlier run's journal)."""
    pending: int
    """Records not yet accepted by the sink (in the journal or, without one, in memory)."""
    in_memory: int
    """Undelivered records held only in memory (no journal, or appending to it failed)."""
    open_responses: int
    """Responses begun and not yet ended (journal mode)."""
    recovered: int
    """Responses found cut off by a crash at start, billed as ``cancelled``."""
    sink_errors: int
    """Failed (or cancelled) ``sink.write`` calls."""
    degraded: bool
    """The last sink write failed; the worker retries with backoff."""


class Biller:
    """Loss-free delivery of usage records to a :class:`BillingSink`, through a journal.

    Use it from an ASGI lifespan (``await biller.start()`` on startup, ``await biller.stop()``
    on shutdown) or as ``async with Biller(sink, journal_path=...) as biller: ...``.

    ``begin``, ``progress``, ``end`` and ``submit`` never block on the sink and never raise.
    ``batch_size`` caps records per ``sink.write``; ``flush_interval`` is how long the worker
    lets a partial batch fill; ``stop_timeout`` bounds how long ``stop()`` waits for the sink
    (what it does not take stays in the journal for the next start). ``queue_size`` bounds the
    copies of journaled records kept in memory for delivery (beyond it, the worker reads them
    back from the journal); without a journal (or one that cannot be written) it is how many
    undelivered records are held in memory before a warning is logged. Nothing is dropped.
    """

    def __init__(
        self,
        sink: BillingSink,
        *,
        journal_path: str | os.PathLike[str] | None = None,
        durability: Durability = "process",
        queue_size: int = 10_000,
        batch_size: int = 256,
        flush_interval: float = 0.05,
        commit_interval: float = 0.002,
        retry_interval: float = 0.5,
        max_retry_interval: float = 30.0,
        stop_timeout: float | None = 3.0,
        metrics: Metrics | None = None,
    ) -> None:
        if queue_size < 1:
            raise ValueError("queue_size must be >= 1")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if flush_interval < 0:
            raise ValueError("flush_interval must be >= 0")
        if commit_interval < 0:
            raise ValueError("commit_interval must be >= 0")
        if retry_interval <= 0 or max_retry_interval < retry_interval:
            raise ValueError("need 0 < retry_interval <= max_retry_interval")
        if stop_timeout is not None and stop_timeout < 0:
            raise ValueError("stop_timeout must be >= 0")
        if durability not in ("process", "machine"):
            raise ValueError("durability must be 'process' or 'machine'")
        if durability == "machine" and journal_path is None:
            raise ValueError("durability='machine' needs a journal_path")
        self._sink = sink
        #: Where the billing lag goes (``billing_lag_seconds``: a response's end to its record's
        #: delivery to the sink, observed per delivered batch, for its oldest record). A service
        #: built with this biller sets it to its own metrics when it is ``None``.
        self.metrics = metrics
        self._durability: Durability = durability
        self._queue_size = queue_size
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._retry_interval = retry_interval
        self._max_retry_interval = max_retry_interval
        self._stop_timeout = stop_timeout
        self._journal = (
            UsageJournal(journal_path, durability=durability, memory_records=queue_size)
            if journal_path is not None
            else None
        )

        # Shared with the appenders, which may run on other threads.
        self._lock = threading.Lock()
        self._memory: deque[UsageRecord] = deque()
        self._submitted = 0
        self._memory_warned_at = -_MEMORY_WARN_EVERY

        # Owned by the event loop thread.
        self._state: _State = "new"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._wake: asyncio.Event | None = None
        self._stop_lock: asyncio.Lock | None = None
        self._worker: asyncio.Task[None] | None = None
        self._write_task: asyncio.Task[None] | None = None
        self._flush_waiters: list[asyncio.Future[None]] = []
        self._abort = False
        self._degraded = False
        self._retry_delay = retry_interval
        self._retry_at = 0.0
        self._delivered = 0
        self._sink_errors = 0

        # Machine mode: each begin/end awaits the journal's group commit.
        self._commit = (
            GroupCommit(self._journal, commit_interval) if durability == "machine" and self._journal is not None else None
        )

    # -- public API ------------------------------------------------------------------------

    @property
    def sink(self) -> BillingSink:
        return self._sink

    @property
    def journal(self) -> UsageJournal | None:
        return self._journal

    @property
    def durability(self) -> Durability:
        return self._durability

    @property
    def submitted(self) -> int:
        return self._submitted

    @property
    def delivered(self) -> int:
        return self._delivered

    @property
    def pending(self) -> int:
        journal = self._journal.pending if self._journal is not None else 0
        return len(self._memory) + journal

    def stats(self) -> BillerStats:
        journal = self._journal
        return BillerStats(
            submitted=self._submitted,
            delivered=self._delivered,
            pending=self.pending,
            in_memory=len(self._memory),
            open_responses=journal.live if journal is not None else 0,
            recovered=journal.recovered if journal is not None else 0,
            sink_errors=self._sink_errors,
            degraded=self._degraded,
        )

    def begin(self, entry: OpenEntry) -> Awaitable[None] | None:
        """A response was created: journal its open entry. Call before ``response.created``
        goes out, and in machine mode await the result (``None`` means nothing to wait for)."""
        journal = self._journal
        if journal is None or not journal.is_open:
            return None
        try:
            end = journal.append_open(entry)
        except Exception:
            logger.exception("could not journal the start of %s; it is billed when it ends", entry.id)
            return None
        return self._durable_after(end)

    def progress(
        self,
        response_id: str,
        output_tokens: int,
        reasoning_tokens: int = 0,
        *,
        input_tokens: int | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        """A progress mark: ``output_tokens`` generated so far (billed if the process dies); with
        ``input_tokens``/``cached_tokens`` when the response's input grew (``response.append``)."""
        journal = self._journal
        if journal is None or not journal.is_open:
            return
        try:
            journal.append_mark(
                MarkEntry(response_id, output_tokens, reasoning_tokens, time.time(), input_tokens, cached_tokens)
            )
        except Exception:
            logger.exception("could not journal a progress mark of %s", response_id)

    def end(self, record: UsageRecord) -> Awaitable[None] | None:
        """The response ended: journal its record for delivery. Call before its terminal event
        goes out, and in machine mode await the result. Never raises, never drops."""
        journal = self._journal
        if journal is not None and self._state != "new":
            try:
                end = journal.append_close(record)
            except Exception:
                logger.exception(
                    "could not append the usage record of %s to the billing journal %s; keeping it in memory",
                    record.response_id,
                    journal.path,
                )
            else:
                with self._lock:
                    self._submitted += 1
                self._notify()
                return self._durable_after(end) if journal.is_open else None
        self._keep_in_memory(record)
        return None

    def submit(self, record: UsageRecord) -> None:
        """:meth:`end` without waiting for the group commit (the older one-call interface)."""
        self.end(record)

    async def start(self) -> None:
        """Open (and replay) the journal and start the worker. Idempotent while running.

        Raises :class:`~responses_cache.billing.JournalLocked` if another process owns the
        journal.
        """
        if self._state in ("starting", "running", "stopping"):
            return
        if self._state == "stopped":
            raise RuntimeError("a stopped Biller cannot be restarted; create a new one")
        self._state = "starting"
        try:
            if self._journal is not None:
                await asyncio.to_thread(self._journal.open)
        except BaseException:
            self._state = "new"
            raise
        if self._state != "starting":  # stop() ran while the journal was opening
            if self._journal is not None:
                await asyncio.to_thread(self._journal.close)
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        if self._journal is not None and self._memory:  # ended before start(): journal them now
            with self._lock:
                early = list(self._memory)
                self._memory.clear()
            for record in early:
                try:
                    self._journal.append_close(record)
                except Exception:
                    logger.exception("could not journal the usage record of %s", record.response_id)
                    self._memory.append(record)
        self._wake = asyncio.Event()
        self._stop_lock = asyncio.Lock()
        if self._commit is not None:
            self._commit.start()
        self._worker = self._loop.create_task(self._run(), name="responses_cache.billing")
        self._state = "running"
        self._wake.set()

    async def flush(self) -> bool:
        """Make one delivery attempt now (no linger, no backoff wait).

        Returns ``True`` if nothing is pending afterwards, ``False`` if the sink is still
        failing (the records stay in the journal, or in memory without one).
        """
        if self._state == "new":
            raise RuntimeError("Biller.flush() called before start()")
        worker, loop, wake = self._worker, self._loop, self._wake
        if worker is not None and not worker.done() and loop is not None and wake is not None:
            waiter: asyncio.Future[None] = loop.create_future()
            self._flush_waiters.append(waiter)
            wake.set()
            await waiter
        return self.pending == 0

    async def stop(self, timeout: float | _Default | None = _DEFAULT) -> None:
        """Give the sink one last chance, then close the journal and the sink. Idempotent.

        ``timeout`` (default: ``stop_timeout``) bounds the wait for the sink; after it the
        in-flight write is cancelled. Whatever the sink did not accept stays in the journal
        for the next start (without a journal it is logged at ERROR, one JSON line a record).
        """
        limit = self._stop_timeout if isinstance(timeout, _Default) else timeout
        if self._state == "stopped":
            return
        if self._state == "new" and self.pending:
            try:
                await self.start()
            except Exception:
                logger.exception("could not start the Biller to drain it on stop()")
        if self._state in ("new", "starting") or self._stop_lock is None:
            self._state = "stopped"
            await self._finish(limit)
            return
        async with self._stop_lock:
            if self._stopping:  # a concurrent stop() did it
                return
            self._state = "stopping"
            self._poke()
            worker = self._worker
            if worker is not None:
                await self._await_worker(worker, limit)
            self._state = "stopped"
            await self._finish(limit)

    @property
    def _stopping(self) -> bool:
        return self._state in ("stopping", "stopped")

    async def __aenter__(self) -> Biller:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- appenders' helpers (any thread) ---------------------------------------------------

    def _keep_in_memory(self, record: UsageRecord) -> None:
        with self._lock:
            self._submitted += 1
            self._memory.append(record)
            depth = len(self._memory)
        try:
            if self._state == "stopped":
                # No worker will deliver it; the journal (if any) is the last resort.
                self._after_stop([record])
                return
            if depth > self._queue_size:
                self._warn_memory(depth)
            if depth == 1 or depth == self._batch_size:  # the worker recounts when it wakes
                self._notify()
        except Exception:
            logger.exception("could not hand the usage record of %s to the worker", record.response_id)

    def _warn_memory(self, depth: int) -> None:
        now = time.monotonic()
        if now - self._memory_warned_at >= _MEMORY_WARN_EVERY:
            self._memory_warned_at = now
            logger.warning(
                "holding %d undelivered usage records in memory (no usable billing journal); "
                "configure journal_path so that they survive a crash",
                depth,
            )

    def _after_stop(self, records: list[UsageRecord]) -> None:
        journal = self._journal
        for record in records:
            try:
                if journal is None:
                    raise RuntimeError("no journal")
                journal.append_close(record)  # one-shot: open, lock, append, close
            except Exception:
                _log_undeliverable([record])  # stays counted as pending
            else:
                with self._lock, contextlib.suppress(ValueError):
                    self._memory.remove(record)

    def _durable_after(self, end: int) -> Awaitable[None] | None:
        """In machine mode, a future resolved once the journal is synced up to ``end``."""
        return self._commit.after(end) if self._commit is not None else None

    def _notify(self) -> None:
        """Wake the worker from any thread."""
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            return
        if threading.get_ident() == self._loop_thread:
            wake.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed; the worker is gone
            loop.call_soon_threadsafe(wake.set)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- worker ----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                await self._wait_for_work()
                waiters, self._flush_waiters = self._flush_waiters, []
                stopping = self._stopping
                try:
                    await self._pass(force=stopping or bool(waiters))
                except Exception:
                    logger.exception("billing worker pass failed")
                    self._enter_degraded()
                finally:
                    resolve(waiters)
                if stopping:
                    break
        finally:
            waiters, self._flush_waiters = self._flush_waiters, []
            resolve(waiters)

    async def _wait_for_work(self) -> None:
        loop, wake = self._loop, self._wake
        assert loop is not None and wake is not None
        linger_deadline: float | None = None
        while True:
            wake.clear()
            if self._stopping or self._flush_waiters:
                return
            pending = self.pending
            now = loop.time()
            timeout: float | None = None
            if pending:
                if self._degraded:
                    timeout = self._retry_at - now
                elif pending >= self._batch_size:
                    return
                else:
                    if linger_deadline is None:
                        linger_deadline = now + self._flush_interval
                    timeout = linger_deadline - now
            if timeout is not None and timeout <= 0:
                return
            try:
                await asyncio.wait_for(wake.wait(), timeout)
            except asyncio.TimeoutError:
                return

    async def _pass(self, *, force: bool) -> None:
        """Deliver the journal's closed records, then the in-memory ones; stop at a failure."""
        assert self._loop is not None
        if self._degraded and not force and self._loop.time() < self._retry_at:
            return
        journal = self._journal
        if journal is not None and journal.is_open:
            budget = journal.pending  # what was there when the pass began: new records wait
            while budget > 0 and not self._abort:
                # The closes appended by this process are in memory; only a backlog from before a
                # restart (or one larger than queue_size) is read back from the file.
                batch = journal.read_memory(self._batch_size)
                if batch is None:
                    batch = await asyncio.to_thread(journal.read, self._batch_size)
                if batch.records and not await self._deliver(batch.records):
                    self._enter_degraded()
                    return
                if self._durability == "machine":  # a truncation is fdatasync'ed
                    compact = await asyncio.to_thread(journal.ack, batch)
                else:
                    compact = journal.ack(batch)  # one append
                if compact:
                    await asyncio.to_thread(journal.compact)
                if not batch.records:
                    break
                budget -= len(batch.records)
        budget = len(self._memory)
        while budget > 0 and not self._abort:
            with self._lock:
                records = [self._memory[i] for i in range(min(self._batch_size, len(self._memory)))]
            if not await self._deliver(records):
                self._enter_degraded()
                return
            with self._lock:
                for _ in records:
                    self._memory.popleft()
            budget -= len(records)
        self._leave_degraded()

    async def _deliver(self, records: list[UsageRecord]) -> bool:
        """One ``sink.write``, run as its own task so ``stop()`` can cancel just the write."""
        assert self._loop is not None
        task = self._loop.create_task(self._write(tuple(records)))
        self._write_task = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._write_task = None
        if task.cancelled():
            self._sink_errors += 1
            logger.warning("billing sink write of %d records was cancelled", len(records))
            return False
        exc = task.exception()
        if exc is not None:
            self._sink_errors += 1
            logger.warning(
                "billing sink write of %d records failed: %r",
                len(records),
                exc,
                exc_info=None if self._degraded else exc,
            )
            return False
        self._delivered += len(records)
        if self.metrics is not None and records:
            oldest = min(r.finished_at for r in records)
            self.metrics.observe("billing_lag_seconds", max(time.time() - oldest, 0.0))
        return True

    async def _write(self, records: tuple[UsageRecord, ...]) -> None:
        await self._sink.write(records)

    def _enter_degraded(self) -> None:
        assert self._loop is not None
        delay = self._retry_delay if self._degraded else self._retry_interval
        if not self._degraded:
            logger.warning(
                "billing sink is failing; records wait in the %s, retrying in %.3gs",
                "journal" if self._journal is not None else "memory",
                delay,
            )
        self._degraded = True
        self._retry_at = self._loop.time() + delay * random.uniform(0.5, 1.0)
        self._retry_delay = min(delay * 2, self._max_retry_interval)

    def _leave_degraded(self) -> None:
        if self._degraded:
            logger.info("billing sink recovered")
        self._degraded = False
        self._retry_delay = self._retry_interval

    # -- stop helpers ----------------------------------------------------------------------

    async def _await_worker(self, worker: asyncio.Task[None], limit: float | None) -> None:
        done, _ = await asyncio.wait({worker}, timeout=limit)
        if not done:
            logger.warning(
                "billing sink did not drain within %ss; undelivered records stay in the %s",
                limit,
                "journal for the next start" if self._journal is not None else "memory",
            )
            self._abort = True
            if self._write_task is not None:
                self._write_task.cancel()
            self._poke()
            done, _ = await asyncio.wait({worker}, timeout=1.0)
            if not done:
                worker.cancel()
                await asyncio.wait({worker})
        if not worker.cancelled() and worker.exception() is not None:
            logger.error("billing worker crashed", exc_info=worker.exception())

    async def _finish(self, limit: float | None) -> None:
        """Stop the group commit, persist stragglers, close the journal and the sink."""
        if self._commit is not None:
            await self._commit.stop()
        if self._journal is not None:
            await asyncio.to_thread(self._journal.close)
        with self._lock:
            leftovers = list(self._memory)
        if leftovers:
            if self._journal is None:
                logger.error(
                    "billing sink did not accept %d usage records and no journal is configured; "
                    "they are logged below and will be lost when the process exits",
                    len(leftovers),
                )
            await asyncio.to_thread(self._after_stop, leftovers)
        try:
            await asyncio.wait_for(self._sink.close(), limit)
        except Exception:
            logger.exception("closing the billing sink failed")


def _log_undeliverable(records: Iterable[UsageRecord]) -> None:
    for record in records:
        logger.error("undeliverable usage record: %s", encode_record(record).decode())
