"""The Biller: takes usage records off the request path and delivers them without loss.

``submit()`` is a plain synchronous call that appends to an in-memory queue and returns; one
background worker task batches the queue into the :class:`~responses_cache.billing.BillingSink`.
Billing therefore overlaps with the next turn instead of delaying this one.

Where a record can be, and how it moves::

    submit() ──▶ queue (≤ queue_size) ──batch──▶ sink.write()  ✓ delivered
        │ full          │ sink failing / write failed
        ▼               ▼
      spill file (fsync'ed JSONL; or an in-memory overflow deque without spill_path)
        └──────── replayed in order when the sink recovers, and at start() ────────▶ sink

While the sink is failing ("degraded"), the worker moves new batches straight to the spill and
retries the oldest spilled batch with exponential backoff (``retry_interval`` doubling up to
``max_retry_interval``, with jitter). ``stop()`` gives the sink one last chance, spills whatever
it does not accept, and leaves the spill for the next process's ``start()``.
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
from collections.abc import Iterable, Sequence
from itertools import islice
from types import TracebackType
from typing import Final, Literal

import msgspec

from .record import UsageRecord, encode_record
from .sinks import BillingSink
from .spill import SpillFile

__all__ = ["Biller", "BillerStats"]

logger = logging.getLogger("responses_cache.billing")

_State = Literal["new", "starting", "running", "stopping", "stopped"]


class _Default:
    pass


_DEFAULT: Final = _Default()
_OVERFLOW_WARN_EVERY: Final = 60.0  # seconds between "in-memory overflow" warnings


class BillerStats(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a :class:`Biller`'s counters."""

    submitted: int
    """Records passed to ``submit()`` on this Biller."""
    delivered: int
    """Records accepted by the sink (including ones replayed from an earlier run's spill)."""
    spilled: int
    """Records written to the spill file (a record can be counted more than once)."""
    overflowed: int
    """Records put in the in-memory overflow (no spill file configured, or it failed)."""
    pending: int
    """Records not yet accepted by the sink: queued, in flight, spilled or in the overflow."""
    sink_errors: int
    """Failed (or cancelled) ``sink.write`` calls."""
    degraded: bool
    """The last sink write failed; new records go to the spill until a retry succeeds."""


class Biller:
    """Overlapped, loss-free delivery of usage records to a :class:`BillingSink`.

    Use it from an ASGI lifespan (``await biller.start()`` on startup, ``await biller.stop()``
    on shutdown) or as ``async with Biller(sink) as biller: ...``.

    ``submit(record)`` never blocks on the sink and never raises. It is thread-safe, so sync
    route handlers running in a thread pool may call it too. When the queue holds
    ``queue_size`` records, further records are appended to the spill file synchronously (a
    disk write, as back-pressure); with no ``spill_path`` they go to an unbounded in-memory
    overflow deque instead, because a record is never dropped. Configure ``spill_path`` in
    production: it bounds memory and makes undelivered records survive a restart.

    ``batch_size`` caps records per ``sink.write``. ``flush_interval`` is how long the worker
    lets a partial batch fill before writing it. ``stop_timeout`` bounds how long ``stop()``
    waits for the sink before cancelling the in-flight write and spilling the rest.
    """

    def __init__(
        self,
        sink: BillingSink,
        *,
        queue_size: int = 10_000,
        batch_size: int = 256,
        flush_interval: float = 0.05,
        spill_path: str | os.PathLike[str] | None = None,
        retry_interval: float = 0.5,
        max_retry_interval: float = 30.0,
        stop_timeout: float | None = 30.0,
        spill_fsync: bool = True,
    ) -> None:
        if queue_size < 1:
            raise ValueError("queue_size must be >= 1")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if flush_interval < 0:
            raise ValueError("flush_interval must be >= 0")
        if retry_interval <= 0 or max_retry_interval < retry_interval:
            raise ValueError("need 0 < retry_interval <= max_retry_interval")
        self._sink = sink
        self._queue_size = queue_size
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._retry_interval = retry_interval
        self._max_retry_interval = max_retry_interval
        self._stop_timeout = stop_timeout
        self._spill = SpillFile(spill_path, fsync=spill_fsync) if spill_path is not None else None

        # Shared with submit(), which may run on other threads.
        self._lock = threading.Lock()
        self._queue: deque[UsageRecord] = deque()
        self._overflow: deque[UsageRecord] = deque()
        self._closed = False  # set when stop() begins: submit() bypasses the queue
        self._finalized = False  # set once stop() no longer drains anything
        self._submitted = 0
        self._spilled = 0
        self._overflowed = 0
        self._overflow_warned_at = -_OVERFLOW_WARN_EVERY

        # Owned by the event loop thread.
        self._state: _State = "new"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._wake: asyncio.Event | None = None
        self._stop_lock: asyncio.Lock | None = None
        self._worker: asyncio.Task[None] | None = None
        self._write_task: asyncio.Task[None] | None = None
        self._flush_waiters: list[asyncio.Future[None]] = []
        self._in_flight: Sequence[UsageRecord] = ()
        self._stopping = False
        self._stopped = False
        self._abort = False
        self._degraded = False
        self._retry_delay = retry_interval
        self._retry_at = 0.0
        self._delivered = 0
        self._sink_errors = 0

    # -- public API ------------------------------------------------------------------------

    @property
    def sink(self) -> BillingSink:
        return self._sink

    @property
    def spill(self) -> SpillFile | None:
        return self._spill

    @property
    def submitted(self) -> int:
        return self._submitted

    @property
    def delivered(self) -> int:
        return self._delivered

    @property
    def spilled(self) -> int:
        return self._spilled

    @property
    def pending(self) -> int:
        spill = self._spill.pending if self._spill is not None else 0
        return len(self._queue) + len(self._in_flight) + len(self._overflow) + spill

    def stats(self) -> BillerStats:
        return BillerStats(
            submitted=self._submitted,
            delivered=self._delivered,
            spilled=self._spilled,
            overflowed=self._overflowed,
            pending=self.pending,
            sink_errors=self._sink_errors,
            degraded=self._degraded,
        )

    def submit(self, record: UsageRecord) -> None:
        """Hand a record to the Biller. Synchronous, thread-safe; never blocks on the sink and
        never raises (a full queue costs one spill append)."""
        stored = False
        try:
            notify = False
            with self._lock:
                self._submitted += 1
                closed = self._closed
                depth = len(self._queue)
                if not closed and depth < self._queue_size:
                    self._queue.append(record)
                    stored = True
                    notify = depth == 0 or depth + 1 == self._batch_size
            if not stored:
                self._store([record], late=closed)
                stored = True
            elif notify:
                self._notify()
        except Exception:
            logger.exception("Biller.submit failed unexpectedly; keeping the record in memory")
            if not stored:
                self._overflow.append(record)

    async def start(self) -> None:
        """Open (and replay) the spill file and start the worker. Idempotent while running."""
        if self._state in ("starting", "running", "stopping"):
            return
        if self._state == "stopped":
            raise RuntimeError("a stopped Biller cannot be restarted; create a new one")
        self._state = "starting"
        try:
            if self._spill is not None:
                await asyncio.to_thread(self._spill.open)
        except BaseException:
            self._state = "new"
            raise
        if self._state != "starting":  # stop() ran while the spill was opening
            if self._spill is not None:
                await asyncio.to_thread(self._spill.close)
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        self._stop_lock = asyncio.Lock()
        self._worker = self._loop.create_task(self._run(), name="responses_cache.billing")
        self._state = "running"
        self._wake.set()

    async def flush(self) -> bool:
        """Deliver everything submitted so far now (no linger, no backoff wait).

        Makes one delivery attempt for the queue and the spill; returns ``True`` if nothing is
        pending afterwards, ``False`` if the sink is still failing (records stay spilled).
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
        """Drain the queue into the sink, spill what it does not accept, close the sink.

        Idempotent. ``timeout`` (default: the ``stop_timeout`` given to the constructor)
        bounds the wait for the sink; after it, the in-flight write is cancelled and every
        record not yet accepted is spilled. Nothing is dropped.
        """
        limit = self._stop_timeout if isinstance(timeout, _Default) else timeout
        if self._state == "stopped":
            return
        if self._state == "new" and self.pending:
            # Never started, but holding records: run the worker once to deliver them.
            try:
                await self.start()
            except Exception:
                logger.exception("could not start the Biller to drain it on stop()")
        if self._state in ("new", "starting") or self._stop_lock is None:
            await self._close_never_started()
            return
        async with self._stop_lock:
            if self._stopped:
                return
            self._state = "stopping"
            with self._lock:
                self._closed = True
            self._stopping = True
            self._poke()
            worker = self._worker
            if worker is not None:
                await self._await_worker(worker, limit)
            self._finalize()
            if self._spill is not None:
                await asyncio.to_thread(self._spill.close)
            await self._close_sink(limit)
            self._state = "stopped"
            self._stopped = True

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

    # -- submit helpers (any thread) -------------------------------------------------------

    def _store(self, records: list[UsageRecord], *, late: bool = False) -> None:
        """Put records in the spill file, or the overflow if there is none or it fails."""
        if self._spill is not None:
            try:
                self._spill.append(records)
            except Exception:
                logger.exception(
                    "could not append %d usage records to the billing spill %s; "
                    "keeping them in memory",
                    len(records),
                    self._spill.path,
                )
            else:
                with self._lock:
                    self._spilled += len(records)
                return
        with self._lock:
            was_empty = not self._overflow
            self._overflow.extend(records)
            self._overflowed += len(records)
        if late and self._finalized:
            _log_undeliverable(records)
        elif was_empty:
            self._warn_overflow()

    def _warn_overflow(self) -> None:
        now = time.monotonic()
        if now - self._overflow_warned_at >= _OVERFLOW_WARN_EVERY:
            self._overflow_warned_at = now
            logger.warning(
                "holding usage records in an in-memory overflow (queue full or sink failing, "
                "and no usable spill file); configure spill_path to bound memory"
            )

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
                    self._rescue_in_flight()
                    if stopping:
                        break
                    self._enter_degraded()
                finally:
                    _resolve(waiters)
                if stopping:
                    break
        except asyncio.CancelledError:
            self._emergency_spill()
            raise
        finally:
            waiters, self._flush_waiters = self._flush_waiters, []
            _resolve(waiters)

    async def _wait_for_work(self) -> None:
        loop, wake = self._loop, self._wake
        assert loop is not None and wake is not None
        linger_deadline: float | None = None
        while True:
            wake.clear()
            if self._stopping or self._flush_waiters:
                return
            depth = len(self._queue)
            if depth >= self._batch_size:
                return
            backlog = self._has_backlog()
            if backlog and not self._degraded:
                return
            now = loop.time()
            timeout: float | None = None
            if depth:
                if linger_deadline is None:
                    linger_deadline = now + self._flush_interval
                timeout = linger_deadline - now
            if backlog:
                until_retry = self._retry_at - now
                timeout = until_retry if timeout is None else min(timeout, until_retry)
            if timeout is not None and timeout <= 0:
                return
            try:
                await asyncio.wait_for(wake.wait(), timeout)
            except asyncio.TimeoutError:
                return

    async def _pass(self, *, force: bool) -> None:
        """Replay the backlog if due, then move everything queued now to the sink or spill."""
        assert self._loop is not None
        due = force or not self._degraded or self._loop.time() >= self._retry_at
        if due and not self._abort and self._has_backlog():
            await self._replay_backlog()
        remaining = len(self._queue)
        while remaining > 0:
            bypass = self._degraded or self._abort
            with self._lock:
                take = min(remaining if bypass else self._batch_size, remaining, len(self._queue))
                batch = [self._queue.popleft() for _ in range(take)]
            if not batch:
                break
            remaining -= len(batch)
            # Until it is delivered or persisted, the batch exists only here: _run rescues it
            # if this pass fails or is cancelled.
            self._in_flight = batch
            if bypass or not await self._deliver(batch):
                await self._persist(batch)
                if not bypass:
                    self._enter_degraded()
            self._in_flight = ()

    async def _replay_backlog(self) -> None:
        """Deliver spilled, then overflowed, records oldest first; stop at the first failure.

        Replays at most what was backlogged when it began, so the queue gets its turn.
        """
        budget = self._backlog_size()
        while budget > 0 and not self._abort:
            spill = self._spill
            if spill is not None and spill.pending > 0:
                try:
                    batch = await asyncio.to_thread(spill.read, self._batch_size)
                except OSError:
                    logger.exception("could not read the billing spill %s", spill.path)
                    self._enter_degraded()
                    return
                if batch.lines == 0:
                    break
                if batch.records and not await self._deliver(batch.records):
                    self._enter_degraded()
                    return
                await asyncio.to_thread(spill.commit, batch)
                budget -= batch.lines
            elif self._overflow:
                with self._lock:
                    records = list(islice(self._overflow, self._batch_size))
                if not await self._deliver(records):
                    self._enter_degraded()
                    return
                with self._lock:
                    for _ in records:
                        self._overflow.popleft()
                budget -= len(records)
            else:
                break
        self._leave_degraded()

    async def _deliver(self, records: Sequence[UsageRecord]) -> bool:
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
        return True

    async def _write(self, records: tuple[UsageRecord, ...]) -> None:
        await self._sink.write(records)

    async def _persist(self, records: list[UsageRecord]) -> None:
        """:meth:`_store` off the event loop (a spill append is a blocking fsync)."""
        try:
            await asyncio.to_thread(self._store, records)
        except RuntimeError:  # no executor (interpreter shutting down): block instead
            self._store(records)

    def _has_backlog(self) -> bool:
        return bool(self._overflow) or (self._spill is not None and self._spill.pending > 0)

    def _backlog_size(self) -> int:
        return len(self._overflow) + (self._spill.pending if self._spill is not None else 0)

    def _enter_degraded(self) -> None:
        assert self._loop is not None
        delay = self._retry_delay if self._degraded else self._retry_interval
        if not self._degraded:
            logger.warning("billing sink is failing; spilling records and retrying in %.3gs", delay)
        self._degraded = True
        self._retry_at = self._loop.time() + delay * random.uniform(0.5, 1.0)
        self._retry_delay = min(delay * 2, self._max_retry_interval)

    def _leave_degraded(self) -> None:
        if self._degraded:
            logger.info("billing sink recovered")
        self._degraded = False
        self._retry_delay = self._retry_interval

    def _rescue_in_flight(self) -> None:
        records, self._in_flight = list(self._in_flight), ()
        if records:
            self._store(records)

    def _emergency_spill(self) -> None:
        """The worker was cancelled without stop(): persist in-flight and queued records now."""
        with self._lock:
            self._closed = True
            records = [*self._in_flight, *self._queue]
            self._queue.clear()
        self._in_flight = ()
        if records:
            logger.warning(
                "billing worker cancelled without Biller.stop(); spilling %d records",
                len(records),
            )
            self._store(records)
        if self._spill is not None:
            self._spill.close()  # release the lock; later appends are one-shot

    # -- stop helpers ----------------------------------------------------------------------

    async def _await_worker(self, worker: asyncio.Task[None], limit: float | None) -> None:
        done, _ = await asyncio.wait({worker}, timeout=limit)
        if not done:
            logger.warning(
                "billing sink did not drain within %ss; spilling the remaining records", limit
            )
            self._abort = True
            if self._write_task is not None:
                self._write_task.cancel()
            self._poke()
            done, _ = await asyncio.wait({worker}, timeout=limit)
            if not done:
                worker.cancel()
                await asyncio.wait({worker})
        if not worker.cancelled() and worker.exception() is not None:
            logger.error("billing worker crashed", exc_info=worker.exception())

    def _finalize(self) -> None:
        """After the worker: persist stragglers; report what cannot survive the process."""
        with self._lock:
            self._closed = True
            self._finalized = True  # from now on, _store logs what it cannot persist
            leftovers = list(self._queue)
            self._queue.clear()
        if leftovers:
            self._store(leftovers)
        if self._spill is None and self._overflow:
            logger.error(
                "billing sink did not accept %d usage records and no spill_path is "
                "configured; they are logged below and will be lost when the process exits",
                len(self._overflow),
            )
            _log_undeliverable(self._overflow)

    async def _close_sink(self, limit: float | None) -> None:
        try:
            await asyncio.wait_for(self._sink.close(), limit)
        except Exception:
            logger.exception("closing the billing sink failed")

    async def _close_never_started(self) -> None:
        self._state = "stopped"
        self._stopped = True
        self._finalize()
        if self._spill is not None:
            await asyncio.to_thread(self._spill.close)
        await self._close_sink(self._stop_timeout)


def _resolve(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


def _log_undeliverable(records: Iterable[UsageRecord]) -> None:
    for record in records:
        logger.error("undeliverable usage record: %s", encode_record(record).decode())
