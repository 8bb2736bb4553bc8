"""The write-ahead usage journal: every response's usage is on disk before the client hears of it.

Format: append-only JSON Lines, one *entry* per line, tagged by ``"t"``:

* ``open``  — a response was created: id, tenant, model, route, ``created_at`` and prompt tokens.
  Written before ``response.created`` goes out.
* ``mark``  — a progress mark: the output (and reasoning) tokens generated so far.
* ``close`` — the final :class:`~responses_cache.billing.record.UsageRecord`. Written before the
  response's terminal event goes out.
* ``ack``   — the sink accepted the closes with these response ids (a checkpoint).

Every append is one ``os.write`` of whole lines, so an entry the journal accepted is in the
kernel's page cache and survives a kill of the process. Surviving a crash of the machine needs
:meth:`UsageJournal.sync` (``fdatasync``); the :class:`~responses_cache.billing.Biller` calls it
as a group commit in ``durability="machine"`` mode.

:meth:`UsageJournal.open` replays the file: closes without an ack are pending delivery, and an
open without a close (the process died mid-response) becomes a ``cancelled`` record with the
usage of its last progress mark and ``recovered=True``, appended as a close. Delivery is
:meth:`read` → ``sink.write`` → :meth:`ack`; the acked prefix of the file is dropped by
truncation or compaction (the live rest is copied to ``<path>.compact`` and renamed over the
file).

A crash in the middle of an append can leave a torn last line; it is moved to
``<path>.corrupt`` when the file is opened (it was never acknowledged to its writer). One
process owns a journal: it is locked with ``flock`` while open, and a second opener gets
:class:`JournalLocked`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import Literal

import msgspec

from .record import UsageRecord

if sys.platform != "win32":
    import fcntl

__all__ = [
    "AckEntry",
    "CloseEntry",
    "Durability",
    "JournalBatch",
    "JournalLocked",
    "MarkEntry",
    "OpenEntry",
    "UsageJournal",
]

logger = logging.getLogger("responses_cache.billing")

Durability = Literal["process", "machine"]
_CHUNK = 1 << 16


class JournalLocked(OSError):
    """Another open :class:`UsageJournal` (in this or another process) owns the file."""


class OpenEntry(msgspec.Struct, tag="open", tag_field="t", frozen=True, kw_only=True):
    """A response was created; what is known of its usage before it generates anything."""

    id: str
    tenant: str
    model: str
    route: str
    created_at: float
    input_tokens: int
    cached_tokens: int = 0
    transport: str = "http"
    previous_response_id: str | None = None
    #: A ``background: true`` response (marked ``failed`` in the store if a crash cuts it off).
    background: bool = False


class MarkEntry(msgspec.Struct, tag="mark", tag_field="t", frozen=True, omit_defaults=True):
    """Progress of a response: output (and reasoning) tokens generated so far, at ``at``; and,
    once a response makes several engine calls (``response.append``), its input so far."""

    id: str
    output_tokens: int
    reasoning_tokens: int
    at: float
    #: Input (and cached) tokens of all its engine calls so far (``None``: the open entry's).
    input_tokens: int | None = None
    cached_tokens: int | None = None


class CloseEntry(msgspec.Struct, tag="close", tag_field="t", frozen=True):
    """A response ended: its final usage record."""

    record: UsageRecord


class AckEntry(msgspec.Struct, tag="ack", tag_field="t", frozen=True):
    """The sink accepted the closes of these response ids."""

    ids: list[str]


Entry = OpenEntry | MarkEntry | CloseEntry | AckEntry

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Entry)


class JournalBatch(msgspec.Struct, frozen=True):
    """Closed records read from the head of the journal; pass it back to :meth:`UsageJournal.ack`."""

    records: list[UsageRecord]
    start: int
    """Byte offset of the first line read."""
    end: int
    """Byte offset just past the last line read."""
    skipped: list[str] = []
    """Closes passed over because an ``ack`` from before a restart covers them."""
    from_memory: bool = False
    """Taken from the in-memory copy of the closes appended since the journal was opened."""


class _Live:
    """A response with an open entry and no close yet."""

    __slots__ = ("entry", "mark", "offset")

    def __init__(self, entry: OpenEntry, offset: int) -> None:
        self.entry = entry
        self.mark: MarkEntry | None = None
        self.offset = offset


def recovered_record(entry: OpenEntry, mark: MarkEntry | None) -> UsageRecord:
    """The record of a response cut off by a crash: ``cancelled``, with its last mark's usage."""
    output = mark.output_tokens if mark is not None else 0
    prompt, cached = entry.input_tokens, entry.cached_tokens
    if mark is not None and mark.input_tokens is not None:
        prompt, cached = mark.input_tokens, mark.cached_tokens or 0
    return UsageRecord(
        response_id=entry.id,
        tenant=entry.tenant,
        model=entry.model,
        route=entry.route,
        status="cancelled",
        input_tokens=prompt,
        cached_tokens=min(cached, prompt),
        output_tokens=output,
        reasoning_tokens=min(mark.reasoning_tokens, output) if mark is not None else 0,
        created_at=entry.created_at,
        finished_at=mark.at if mark is not None else entry.created_at,
        transport=entry.transport,
        previous_response_id=entry.previous_response_id,
        recovered=True,
    )


class UsageJournal:
    """Append-only journal of response usage; the Biller's only store of undelivered records.

    Appends (:meth:`append_open`, :meth:`append_mark`, :meth:`append_close`) are one
    ``os.write`` each and return the journal's logical length afterwards (bytes ever appended),
    which :meth:`sync` reports back once it is on stable storage. All methods are thread-safe;
    :meth:`open`, :meth:`read`, :meth:`ack` and :meth:`sync` do blocking I/O and belong off the
    event loop.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "process",
        compact_min_bytes: int = 1 << 20,
        memory_records: int = 10_000,
    ) -> None:
        if durability not in ("process", "machine"):
            raise ValueError("durability must be 'process' or 'machine'")
        self._path = Path(path)
        self._durable = durability == "machine"
        self._compact_min_bytes = compact_min_bytes
        self._lock = threading.Lock()  # file position, size, offsets, live responses
        self._sync_lock = threading.Lock()  # one fdatasync at a time; the fd never changes under it
        self._fd: int | None = None
        self._head = 0  # everything before it is delivered (or not a close)
        self._size = 0
        self._pending = 0  # closes not acked
        self._live: dict[str, _Live] = {}
        self._skip: set[str] = set()  # closes past the head already acked before a restart
        # A copy of the unacked closes (with the offset just past each), so that delivery need
        # not read the file back; valid while ``_mirrored`` (it holds every close past the head).
        self._mirror: deque[tuple[UsageRecord, int]] = deque()
        self._mirror_limit = memory_records
        self._mirrored = True
        self._appended = 0  # logical bytes appended since open (never goes back)
        self._synced = 0
        self.recovered = 0
        """Responses found open without a close when the journal was opened."""
        self.recovered_entries: list[OpenEntry] = []
        """Their open entries (a background response among them is marked ``failed``)."""
        self.replayed = 0
        """Closed records found undelivered when the journal was opened (recovered ones included)."""

    @property
    def path(self) -> Path:
        return self._path

    @property
    def corrupt_path(self) -> Path:
        """Where torn or undecodable lines are moved for inspection."""
        return self._path.with_name(self._path.name + ".corrupt")

    @property
    def pending(self) -> int:
        """Closed records not yet acknowledged by the sink."""
        return self._pending

    @property
    def live(self) -> int:
        """Responses with an open entry and no close."""
        return len(self._live)

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    @property
    def appended(self) -> int:
        return self._appended

    @property
    def synced(self) -> int:
        return self._synced

    # -- lifecycle -------------------------------------------------------------------------

    @staticmethod
    def probe(path: str | os.PathLike[str]) -> None:
        """Raise :class:`JournalLocked` now if another process holds ``path`` (a cheap check
        before a server starts; :meth:`open` takes the lock for real)."""
        target = Path(path)
        if not target.exists():
            return
        fd = os.open(target, os.O_RDONLY)
        try:
            _lock_fd(fd, target)
        finally:
            os.close(fd)  # closing releases the probe's lock

    def open(self) -> None:
        """Lock the file, repair a torn tail, and replay it (see the module docstring)."""
        with self._lock:
            if self._fd is not None:
                return
            fd = self._open_fd()
            tmp = self._compact_path()
            if tmp.exists():  # a compaction interrupted by a crash; the original is intact
                tmp.unlink()
            self._fd = fd
            self._size = os.fstat(fd).st_size
            self._appended = self._synced = 0
            try:
                self._replay_locked(fd)
            except BaseException:
                os.close(fd)
                self._fd = None
                raise

    def close(self) -> None:
        """Release the file (after a final ``fdatasync`` in machine mode). Idempotent."""
        with self._sync_lock, self._lock:
            if self._fd is None:
                return
            if self._durable:
                try:
                    os.fdatasync(self._fd)
                    self._synced = self._appended
                except OSError:
                    logger.exception("could not sync the billing journal %s", self._path)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> UsageJournal:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- appends (the turn's path) ---------------------------------------------------------

    def append_open(self, entry: OpenEntry) -> int:
        data = _encoder.encode(entry) + b"\n"
        with self._lock:
            offset = self._size
            end = self._append_locked(data)
            self._live[entry.id] = _Live(entry, offset)
            return end

    def append_mark(self, entry: MarkEntry) -> int:
        data = _encoder.encode(entry) + b"\n"
        with self._lock:
            live = self._live.get(entry.id)
            if live is None:
                return self._appended
            end = self._append_locked(data)
            live.mark = entry
            return end

    def append_close(self, record: UsageRecord) -> int:
        """Append a close. On a journal that is not open (its owner stopped), open, lock,
        append and close again, so a late record still reaches the file."""
        data = _encoder.encode(CloseEntry(record)) + b"\n"
        with self._lock:
            if self._fd is None:
                fd = self._open_fd()
                try:
                    _write_all(fd, data)
                    if self._durable:
                        os.fdatasync(fd)
                finally:
                    os.close(fd)
                return self._appended
            end = self._append_locked(data)
            self._live.pop(record.response_id, None)
            self._pending += 1
            if self._mirrored:
                if len(self._mirror) < self._mirror_limit:
                    self._mirror.append((record, self._size))
                else:  # too many to hold: delivery reads the file until it catches up
                    self._mirrored = False
                    self._mirror.clear()
            return end

    def _append_locked(self, data: bytes) -> int:
        fd = self._require_open()
        try:
            _write_all(fd, data)
        except BaseException:
            # Never leave a partial line behind: the next append would be glued onto it.
            try:
                os.ftruncate(fd, self._size)
            except OSError:
                logger.exception("could not roll back a failed append to %s", self._path)
            raise
        self._size += len(data)
        self._appended += len(data)
        return self._appended

    def sync(self) -> int:
        """``fdatasync`` what has been appended; returns the logical length now on disk."""
        with self._sync_lock:
            with self._lock:
                fd, target = self._fd, self._appended
            if fd is None or target <= self._synced:
                return self._synced
            os.fdatasync(fd)
            self._synced = max(self._synced, target)
            return self._synced

    # -- delivery --------------------------------------------------------------------------

    def read_memory(self, max_records: int) -> JournalBatch | None:
        """Up to ``max_records`` closed records from the head without touching the file, or
        ``None`` when they must be read from it (:meth:`read`). Never blocks on I/O."""
        with self._lock:
            if not self._mirrored or self._skip:
                return None
            taken = list(islice(self._mirror, max_records))
            end = taken[-1][1] if taken else self._head
            return JournalBatch([r for r, _ in taken], self._head, end, from_memory=True)

    def read(self, max_records: int) -> JournalBatch:
        """Up to ``max_records`` closed records from the head (does not consume them)."""
        batch = self.read_memory(max_records)
        if batch is not None:
            return batch
        with self._lock:
            fd = self._require_open()
            start = pos = self._head
            end = self._size
            skip = set(self._skip)
        records: list[UsageRecord] = []
        skipped: list[str] = []
        carry = b""
        consumed = start
        while len(records) < max_records and pos < end:
            chunk = os.pread(fd, min(_CHUNK, end - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            data = carry + chunk
            cut = 0
            while len(records) < max_records:
                nl = data.find(b"\n", cut)
                if nl < 0:
                    break
                line = data[cut:nl]
                cut = nl + 1
                entry = self._decode(line)
                if isinstance(entry, CloseEntry):
                    rid = entry.record.response_id
                    if rid in skip:
                        skipped.append(rid)
                    else:
                        records.append(entry.record)
            consumed += cut
            carry = data[cut:]
        return JournalBatch(records=records, start=start, end=consumed, skipped=skipped)

    def ack(self, batch: JournalBatch) -> bool:
        """The sink accepted ``batch``: checkpoint it (one append), and truncate the file when
        nothing in it is left to deliver. Returns ``True`` when :meth:`compact` is due."""
        ack = _encoder.encode(AckEntry([r.response_id for r in batch.records])) + b"\n"
        with self._lock:
            fd = self._require_open()
            if batch.start != self._head:
                raise ValueError("journal batch is stale (acked twice or out of order)")
            if batch.from_memory and self._mirrored:  # (the copy may have been dropped meanwhile)
                for _ in batch.records:
                    self._mirror.popleft()
            elif not self._mirrored and batch.end >= self._size:
                self._mirrored = True  # caught up: the closes appended from now on are mirrored
            self._skip.difference_update(batch.skipped)
            self._pending = max(0, self._pending - len(batch.records))
            if not batch.records and batch.end >= self._size:
                self._pending = 0  # nothing left to read, whatever the counter said
            if self._pending == 0 and not self._skip and not self._live:
                # Every close in the file is delivered and no response is open: start afresh.
                os.ftruncate(fd, 0)
                if self._durable:
                    os.fdatasync(fd)
                self._head = self._size = self._pending = 0
                self._skip.clear()
                self._mirror.clear()
                self._mirrored = True
                return False
            if batch.records:
                self._append_locked(ack)
            self._head = batch.end
            return self._head >= self._compact_min_bytes and self._head * 2 >= self._size

    # -- internals -------------------------------------------------------------------------

    def compact(self) -> None:
        """Drop the delivered prefix: copy the live part (open responses' entries and
        everything past the head) to ``<path>.compact`` and rename it over the file."""
        tmp = self._compact_path()
        with self._lock:
            fd = self._require_open()
            head, size0 = self._head, self._size
            carried = [live for live in self._live.values() if live.offset < head]
        prefix = bytearray()
        new_offsets: dict[str, int] = {}
        for live in carried:
            new_offsets[live.entry.id] = len(prefix)
            prefix += _encoder.encode(live.entry) + b"\n"
            if live.mark is not None:
                prefix += _encoder.encode(live.mark) + b"\n"
        new_fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _lock_fd(new_fd, tmp)
            _write_all(new_fd, bytes(prefix))
            _copy(fd, new_fd, head, size0)
            with self._sync_lock, self._lock:
                _copy(fd, new_fd, size0, self._size)  # appended while we copied
                if self._durable:
                    os.fsync(new_fd)
                os.replace(tmp, self._path)
                if self._durable:
                    _fsync_dir(self._path.parent)
                shift = len(prefix) - head
                for rid, live in self._live.items():
                    if rid in new_offsets:
                        live.offset = new_offsets[rid]
                    elif live.offset >= head:
                        live.offset += shift
                self._mirror = deque((record, end + shift) for record, end in self._mirror)
                self._fd = new_fd
                self._size += shift
                self._head = len(prefix)
                if self._durable:
                    self._synced = self._appended
                os.close(fd)
        except BaseException:
            if self._fd != new_fd:
                os.close(new_fd)
                tmp.unlink(missing_ok=True)
            raise

    def _replay_locked(self, fd: int) -> None:
        live: dict[str, _Live] = {}
        closes: list[tuple[str, int]] = []  # (id, offset of the line) in file order
        closed: set[str] = set()
        acked: set[str] = set()
        pos, carry_at = 0, 0
        carry = b""
        while pos < self._size:
            chunk = os.pread(fd, min(_CHUNK * 16, self._size - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            data = carry + chunk
            cut = 0
            while True:
                nl = data.find(b"\n", cut)
                if nl < 0:
                    break
                offset = carry_at + cut
                entry = self._decode(data[cut:nl])
                cut = nl + 1
                if isinstance(entry, OpenEntry):
                    live[entry.id] = _Live(entry, offset)
                elif isinstance(entry, MarkEntry):
                    found = live.get(entry.id)
                    if found is not None:
                        found.mark = entry
                elif isinstance(entry, CloseEntry):
                    rid = entry.record.response_id
                    live.pop(rid, None)
                    closed.add(rid)
                    closes.append((rid, offset))
                elif isinstance(entry, AckEntry):
                    acked.update(entry.ids)
            carry_at += cut
            carry = data[cut:]
        unacked = [(rid, off) for rid, off in closes if rid not in acked]
        self._head = unacked[0][1] if unacked else self._size
        self._skip = {rid for rid, off in closes if rid in acked and off > self._head}
        self._pending = len(unacked)
        cut_off = [x for x in live.values() if x.entry.id not in closed]
        orphans = [recovered_record(x.entry, x.mark) for x in cut_off]
        self.recovered_entries = [x.entry for x in cut_off]
        self._live = {}
        if orphans:
            data = b"".join(_encoder.encode(CloseEntry(r)) + b"\n" for r in orphans)
            if not unacked:
                self._head = self._size
            self._append_locked(data)
            self._pending += len(orphans)
            if self._durable:
                os.fdatasync(fd)
            logger.warning(
                "billing journal %s: %d responses were cut off by a crash; billed as cancelled "
                "with the usage of their last progress mark",
                self._path,
                len(orphans),
            )
        self.recovered = len(orphans)
        self.replayed = self._pending
        self._mirror.clear()
        self._mirrored = self._pending == 0
        if self._pending:
            logger.info("billing journal %s holds %d undelivered records", self._path, self._pending)

    def _decode(self, line: bytes) -> Entry | None:
        if not line.strip():
            return None
        try:
            return _decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            logger.error(
                "undecodable line in billing journal %s (%s); moved to %s", self._path, exc, self.corrupt_path
            )
            self._save_corrupt(line)
            return None

    def _compact_path(self) -> Path:
        return self._path.with_name(self._path.name + ".compact")

    def _require_open(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"billing journal {self._path} is not open")
        return self._fd

    def _open_fd(self) -> int:
        """Open (creating if needed), lock, and cut off a torn tail. Caller holds the lock."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        existed = self._path.exists()
        fd = os.open(self._path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            _lock_fd(fd, self._path)
            if not existed:
                _fsync_dir(self._path.parent)
            self._repair_tail(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _repair_tail(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return
        pos = size
        keep = 0
        while pos > 0:
            step = min(_CHUNK, pos)
            pos -= step
            nl = os.pread(fd, step, pos).rfind(b"\n")
            if nl >= 0:
                keep = pos + nl + 1
                break
        torn = os.pread(fd, size - keep, keep)
        logger.warning(
            "billing journal %s ends in a torn line (%d bytes); moved to %s", self._path, len(torn), self.corrupt_path
        )
        self._save_corrupt(torn)
        os.ftruncate(fd, keep)
        if self._durable:
            os.fsync(fd)

    def _save_corrupt(self, data: bytes) -> None:
        if not data.endswith(b"\n"):
            data += b"\n"
        try:
            fd = os.open(self.corrupt_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
        except OSError:
            logger.exception("could not save corrupt journal data to %s", self.corrupt_path)


def encode_entries(entries: Sequence[Entry]) -> bytes:
    """Entries as journal lines (for tools and tests)."""
    return b"".join(_encoder.encode(e) + b"\n" for e in entries)


def _copy(src: int, dst: int, start: int, end: int) -> None:
    pos = start
    while pos < end:
        chunk = os.pread(src, min(_CHUNK * 16, end - pos), pos)
        if not chunk:
            break
        _write_all(dst, chunk)
        pos += len(chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _lock_fd(fd: int, path: Path) -> None:
    if sys.platform != "win32":
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalLocked(
                f"billing journal {path} is in use by another process (or Biller); "
                "give each server process its own journal path"
            ) from None


def _fsync_dir(path: Path) -> None:
    if sys.platform == "win32":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
