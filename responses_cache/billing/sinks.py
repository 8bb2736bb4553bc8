"""Where usage records end up: the :class:`BillingSink` protocol and reference sinks.

A sink receives batches of records from the :class:`~responses_cache.billing.Biller` worker.
The contract:

* ``write`` returns only once the batch is durably accepted, and raises on any failure; the
  Biller then keeps the batch (in its journal) and writes it again later.
* ``write`` is idempotent per ``response_id``: writing a record that was already written must
  not count it twice. Retries after an ambiguous failure (timeout, crash after the write but
  before the acknowledgement) are part of normal operation.
* ``close`` releases resources; the Biller calls it once, from ``stop()``.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import os
import re
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import msgspec

from .record import UsageRecord, encode_jsonl, encode_records

if TYPE_CHECKING:
    import httpx
    import tenacity

__all__ = [
    "BillingSink",
    "CallableSink",
    "JsonlSink",
    "SqliteSink",
    "WebhookError",
    "WebhookSink",
]

logger = logging.getLogger("responses_cache.billing")


@runtime_checkable
class BillingSink(Protocol):
    """Destination for usage records. See the module docstring for the contract."""

    async def write(self, records: Sequence[UsageRecord]) -> None:
        """Durably store ``records``; raise on failure. Idempotent per ``response_id``."""
        ...

    async def close(self) -> None:
        """Release resources. Called once, after the last ``write``."""
        ...


class _RecentIds:
    """A bounded set of the most recently seen response ids (FIFO eviction)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._set: set[str] = set()
        self._order: deque[str] = deque()

    def __contains__(self, key: str) -> bool:
        return key in self._set

    def __len__(self) -> int:
        return len(self._set)

    def add(self, key: str) -> None:
        if self._capacity <= 0 or key in self._set:
            return
        self._set.add(key)
        self._order.append(key)
        if len(self._order) > self._capacity:
            self._set.discard(self._order.popleft())

    def fresh(self, records: Iterable[UsageRecord]) -> list[UsageRecord]:
        """Records whose id is neither remembered nor repeated earlier in ``records``."""
        out: list[UsageRecord] = []
        batch: set[str] = set()
        for record in records:
            rid = record.response_id
            if rid in self._set or rid in batch:
                continue
            batch.add(rid)
            out.append(record)
        return out


# --------------------------------------------------------------------------------------------
# JSON Lines file
# --------------------------------------------------------------------------------------------


class _IdOnly(msgspec.Struct):
    response_id: str


_id_decoder = msgspec.json.Decoder(_IdOnly)


class JsonlSink:
    """Append one JSON line per record to a local file, deduplicating by ``response_id``.

    Deduplication remembers the last ``dedupe_window`` ids written (bounded memory). When the
    file is first opened, ids are loaded from its last ``scan_bytes`` bytes, so records
    re-delivered after a restart are not written twice. Duplicates are only possible for a
    retry of a record older than the window, which the Biller does not produce in practice (it
    only re-sends batches that were never acknowledged).

    Each batch is one ``write`` followed by ``fsync`` (``fsync=False`` trades durability on
    power loss for speed). A torn last line left by a crash is cut off on open.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: bool = True,
        dedupe_window: int = 100_000,
        scan_bytes: int = 64 << 20,
    ) -> None:
        self._path = Path(path)
        self._fsync = fsync
        self._scan_bytes = scan_bytes
        self._seen = _RecentIds(dedupe_window)
        self._fd: int | None = None
        self._lock = asyncio.Lock()
        self._io_lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self._path

    async def write(self, records: Sequence[UsageRecord]) -> None:
        async with self._lock:
            await asyncio.to_thread(self._write_sync, records)

    async def close(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self._close_sync)

    def _write_sync(self, records: Sequence[UsageRecord]) -> None:
        with self._io_lock:
            fd = self._open_sync()
            fresh = self._seen.fresh(records)
            if not fresh:
                return
            data = encode_jsonl(fresh)
            size = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if self._fsync:
                    os.fsync(fd)
            except BaseException:
                os.ftruncate(fd, size)  # never leave a torn line behind
                raise
            for record in fresh:
                self._seen.add(record.response_id)

    def _open_sync(self) -> int:
        if self._fd is not None:
            return self._fd
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            start = max(0, size - self._scan_bytes)
            data = os.pread(fd, size - start, start) if size else b""
            if data and not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
                logger.warning(
                    "billing sink %s ends in a torn line (%d bytes); cutting it off",
                    self._path,
                    len(data) - keep,
                )
                os.ftruncate(fd, start + keep)
                data = data[:keep]
            lines = data.split(b"\n")
            if start > 0:
                lines = lines[1:]  # the first line is probably cut by the scan window
            for line in lines:
                if not line.strip():
                    continue
                try:
                    self._seen.add(_id_decoder.decode(line).response_id)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    logger.warning("skipping an undecodable line in billing sink %s", self._path)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return fd

    def _close_sync(self) -> None:
        with self._io_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


# --------------------------------------------------------------------------------------------
# SQLite
# --------------------------------------------------------------------------------------------

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_COLUMNS = (
    ("response_id", "TEXT PRIMARY KEY NOT NULL"),
    ("tenant", "TEXT NOT NULL"),
    ("model", "TEXT NOT NULL"),
    ("route", "TEXT NOT NULL"),
    ("status", "TEXT NOT NULL"),
    ("input_tokens", "INTEGER NOT NULL"),
    ("cached_tokens", "INTEGER NOT NULL"),
    ("output_tokens", "INTEGER NOT NULL"),
    ("reasoning_tokens", "INTEGER NOT NULL"),
    ("created_at", "REAL NOT NULL"),
    ("finished_at", "REAL NOT NULL"),
    ("transport", "TEXT NOT NULL"),
    ("previous_response_id", "TEXT"),
    ("recovered", "INTEGER NOT NULL DEFAULT 0"),
)


class SqliteSink:
    """Store records in a SQLite table keyed by ``response_id``; a known id is ignored.

    The table (default ``usage_records``) is created if missing; one column per record field.
    The database runs in WAL mode so readers (reports, exporters) do not block the writer. Each
    batch is one transaction. Blocking calls run in a worker thread.
    """

    def __init__(self, path: str | os.PathLike[str], *, table: str = "usage_records") -> None:
        if not _IDENTIFIER.match(table):
            raise ValueError(f"invalid SQLite table name: {table!r}")
        self._path = str(path)
        self._table = table
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        names = ", ".join(name for name, _ in _COLUMNS)
        marks = ", ".join("?" for _ in _COLUMNS)
        # Like INSERT OR IGNORE, but only a duplicate response_id is ignored: OR IGNORE would
        # also silently skip rows that violate NOT NULL.
        self._insert = (
            f"INSERT INTO {table} ({names}) VALUES ({marks}) ON CONFLICT(response_id) DO NOTHING"
        )

    async def write(self, records: Sequence[UsageRecord]) -> None:
        async with self._lock:
            await asyncio.to_thread(self._write_sync, list(records))

    async def close(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self._close_sync)

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            if self._path != ":memory:":
                Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            # Used from asyncio.to_thread workers, serialized by self._lock.
            conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                columns = ", ".join(f"{name} {kind}" for name, kind in _COLUMNS)
                conn.execute(f"CREATE TABLE IF NOT EXISTS {self._table} ({columns})")
                present = {row[1] for row in conn.execute(f"PRAGMA table_info({self._table})")}
                for name, kind in _COLUMNS:
                    if name not in present:  # a table made by an earlier version
                        conn.execute(f"ALTER TABLE {self._table} ADD COLUMN {name} {kind}")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _write_sync(self, records: list[UsageRecord]) -> None:
        conn = self._connect()
        rows = [
            (
                r.response_id,
                r.tenant,
                r.model,
                r.route,
                r.status,
                r.input_tokens,
                r.cached_tokens,
                r.output_tokens,
                r.reasoning_tokens,
                r.created_at,
                r.finished_at,
                r.transport,
                r.previous_response_id,
                int(r.recovered),
            )
            for r in records
        ]
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(self._insert, rows)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # COMMIT itself can fail (SQLITE_BUSY, disk full)
                conn.execute("ROLLBACK")
            raise

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# --------------------------------------------------------------------------------------------
# Webhook
# --------------------------------------------------------------------------------------------


class WebhookError(Exception):
    """The webhook answered with a non-2xx status."""

    def __init__(self, status_code: int, body: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"billing webhook answered HTTP {status_code}: {body[:200]}")
        self.status_code = status_code
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.status_code in (408, 425, 429) or self.status_code >= 500


_WEBHOOK_EXTRA_HINT = (
    "WebhookSink needs httpx and tenacity; install them with "
    "`pip install 'responses-cache[webhook]'`"
)


def _require_webhook_extra() -> None:
    """Fail early, with the fix in the message, if the ``webhook`` extra is not installed."""
    try:
        import httpx  # noqa: F401
        import tenacity  # noqa: F401
    except ImportError as exc:
        raise ImportError(_WEBHOOK_EXTRA_HINT) from exc


class WebhookSink:
    """POST each batch as a JSON array of records to ``url``.

    Idempotency: every element carries its ``response_id``, and receivers must deduplicate on
    it. The ``Idempotency-Key`` header is the response id for a one-record batch, and for
    larger batches ``batch-`` + a SHA-256 of the sorted ids (stable across retries of the same
    batch). Batches can be regrouped after an outage or a restart, so a receiver that dedupes only
    on the header is not exactly-once; dedupe on each element's ``response_id``.

    Retries (inside one ``write``): transport errors, timeouts and HTTP 408/425/429/5xx, with
    exponential backoff and jitter (via tenacity), honouring ``Retry-After`` up to
    ``backoff_max``; at most ``max_attempts`` attempts. Other 4xx fail at once. When ``write``
    finally raises, the Biller keeps the batch in its journal and tries again later.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        max_attempts: int = 5,
        backoff_initial: float = 0.2,
        backoff_max: float = 10.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        _require_webhook_extra()
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self._url = url
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._timeout = timeout
        self._max_attempts = max_attempts
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._client = client
        self._owns_client = client is None

    @property
    def url(self) -> str:
        return self._url

    @staticmethod
    def idempotency_key(records: Sequence[UsageRecord]) -> str:
        """The ``Idempotency-Key`` header sent for ``records`` (see the class docstring)."""
        if len(records) == 1:
            return records[0].response_id
        digest = hashlib.sha256("\n".join(sorted(r.response_id for r in records)).encode())
        return "batch-" + digest.hexdigest()

    async def write(self, records: Sequence[UsageRecord]) -> None:
        if not records:
            return
        import httpx
        import tenacity

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout)
        client = self._client
        body = encode_records(records)
        headers = {**self._headers, "Idempotency-Key": self.idempotency_key(records)}
        backoff = tenacity.wait_exponential(
            multiplier=self._backoff_initial, max=self._backoff_max
        ) + tenacity.wait_random(0, self._backoff_initial)

        def wait(state: tenacity.RetryCallState) -> float:
            delay = float(backoff(state))
            exc = state.outcome.exception() if state.outcome is not None else None
            if isinstance(exc, WebhookError) and exc.retry_after is not None:
                delay = max(delay, min(exc.retry_after, self._backoff_max))
            return delay

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self._max_attempts),
            wait=wait,
            retry=tenacity.retry_if_exception(self._is_retryable),
            before_sleep=tenacity.before_sleep_log(logger, logging.WARNING),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                response = await client.post(self._url, content=body, headers=headers)
                if not response.is_success:
                    raise WebhookError(
                        response.status_code,
                        response.text,
                        retry_after=_retry_after(response.headers.get("Retry-After")),
                    )

    def _is_retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, WebhookError):
            return exc.retryable
        import httpx

        return isinstance(exc, httpx.TransportError)

    async def close(self) -> None:
        if self._client is not None and self._owns_client:
            await self._client.aclose()
        self._client = None


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP-date; fall back to our own backoff


# --------------------------------------------------------------------------------------------
# Any callable
# --------------------------------------------------------------------------------------------

RecordsCallback = Callable[[list[UsageRecord]], object]
"""A sync function, or a function returning an awaitable, that takes a batch of records."""


class CallableSink:
    """Hand each batch (a fresh ``list``) to a plain function or coroutine function.

    ``fn`` may be sync or async; if it returns an awaitable, it is awaited. A sync function runs
    on the event loop unless ``to_thread=True`` (use that for anything that blocks). ``fn``
    signals failure by raising. Ids written successfully are remembered (the last
    ``dedupe_window``) and filtered out of later batches, so a simple ``fn`` such as
    ``list.extend`` is idempotent within a process; ``fn`` must dedupe itself to be idempotent
    across restarts. ``dedupe_window=0`` turns that off.
    """

    def __init__(
        self,
        fn: RecordsCallback,
        *,
        to_thread: bool = False,
        dedupe_window: int = 100_000,
        on_close: Callable[[], object] | None = None,
    ) -> None:
        self._fn = fn
        self._to_thread = to_thread
        self._seen = _RecentIds(dedupe_window)
        self._on_close = on_close

    async def write(self, records: Sequence[UsageRecord]) -> None:
        fresh = self._seen.fresh(records)
        if not fresh:
            return
        if self._to_thread:
            result = await asyncio.to_thread(self._fn, fresh)
        else:
            result = self._fn(fresh)
        if inspect.isawaitable(result):
            await result
        for record in fresh:
            self._seen.add(record.response_id)

    async def close(self) -> None:
        if self._on_close is not None:
            result = self._on_close()
            if inspect.isawaitable(result):
                await result
