"""A local write-ahead spill file for usage records the sink has not accepted yet.

Format: append-only JSON Lines, one :class:`~responses_cache.billing.record.UsageRecord` per
line. Every append is one ``write`` of whole lines followed by ``fsync`` (unless disabled), so a
record the :class:`SpillFile` accepted survives a crash of the process or the machine.

Crash safety:

* A crash in the middle of an append can leave a *torn* last line (no trailing newline). It is
  detected when the file is opened, moved to ``<path>.corrupt`` for inspection and cut off, so
  the next append starts on a fresh line. The torn record was never acknowledged to its writer.
* A failed append (disk full) is rolled back to the previous size before the error propagates.
* A complete line that does not decode is moved to ``<path>.corrupt`` (and logged) when read.

Consumption is read → deliver → :meth:`SpillFile.commit`. The read position lives in memory:
when everything has been delivered the file is truncated to zero; when a large delivered
prefix builds up it is compacted (the undelivered rest is copied to ``<path>.compact`` and
atomically renamed over the file). After a crash, records delivered but not yet compacted away
are delivered again — sinks are idempotent by ``response_id``, so that is harmless.

One process owns a spill file at a time: on POSIX it is locked with ``flock`` while open, and a
second opener gets :class:`SpillFileLocked`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import msgspec

from .record import UsageRecord, decode_record, encode_jsonl

if sys.platform != "win32":
    import fcntl

__all__ = ["SpillBatch", "SpillFile", "SpillFileLocked"]

logger = logging.getLogger("responses_cache.billing")

_CHUNK = 1 << 16


class SpillFileLocked(OSError):
    """Another open :class:`SpillFile` (in this or another process) owns the file."""


class SpillBatch(msgspec.Struct, frozen=True):
    """Records read from the head of a spill file; pass it back to :meth:`SpillFile.commit`."""

    records: list[UsageRecord]
    start: int
    """Byte offset of the first line read."""
    end: int
    """Byte offset just past the last line read."""
    lines: int
    """Lines consumed, including corrupt ones moved aside."""


class SpillFile:
    """Append-only, fsync'ed JSONL file of undelivered usage records.

    All methods are synchronous and thread-safe; they do blocking file I/O, so async code
    should call them through :func:`asyncio.to_thread` where latency matters.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: bool = True,
        compact_min_bytes: int = 1 << 20,
    ) -> None:
        self._path = Path(path)
        self._fsync = fsync
        self._compact_min_bytes = compact_min_bytes
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._head = 0
        self._size = 0
        self._pending = 0

    @property
    def path(self) -> Path:
        return self._path

    @property
    def corrupt_path(self) -> Path:
        """Where torn or undecodable lines are moved for inspection."""
        return self._path.with_name(self._path.name + ".corrupt")

    @property
    def pending(self) -> int:
        """Records (lines) in the file not yet committed as delivered."""
        return self._pending

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        """Open and lock the file, repair a torn tail and count pending records. Idempotent."""
        with self._lock:
            if self._fd is not None:
                return
            fd = self._open_fd()
            tmp = self._compact_path()
            if tmp.exists():  # a compaction interrupted by a crash; the original is intact
                tmp.unlink()
            self._fd = fd
            self._head = 0
            self._size = os.fstat(fd).st_size
            self._pending = self._count_lines(fd, self._size)
            if self._pending:
                logger.info(
                    "billing spill %s holds %d undelivered records", self._path, self._pending
                )

    def close(self) -> None:
        """Release the file. Later appends open, append and close again on their own."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> SpillFile:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------

    def append(self, records: Sequence[UsageRecord]) -> None:
        """Durably append records (one ``write`` + ``fsync``). Raises ``OSError`` on failure."""
        if not records:
            return
        data = encode_jsonl(records)
        with self._lock:
            if self._fd is not None:
                self._append_locked(self._fd, data)
                self._pending += len(records)
                return
            # Not open (the owning Biller has stopped): one-shot append for late records.
            fd = self._open_fd()
            try:
                self._append_locked(fd, data)
            finally:
                os.close(fd)

    def _append_locked(self, fd: int, data: bytes) -> None:
        size = os.fstat(fd).st_size if fd != self._fd else self._size
        try:
            _write_all(fd, data)
            if self._fsync:
                os.fsync(fd)
        except BaseException:
            # Never leave a partial line behind: the next append would be glued onto it.
            try:
                os.ftruncate(fd, size)
            except OSError:
                logger.exception("could not roll back a failed append to %s", self._path)
            raise
        if fd == self._fd:
            self._size = size + len(data)

    # -- reading and committing ------------------------------------------------------------

    def read(self, max_records: int) -> SpillBatch:
        """Read up to ``max_records`` undelivered records from the head (does not consume)."""
        with self._lock:
            fd = self._require_open()
            start = pos = self._head
            end = self._size
            records: list[UsageRecord] = []
            lines = 0
            carry = b""
            while lines < max_records and pos < end:
                chunk = os.pread(fd, min(_CHUNK, end - pos), pos)
                if not chunk:
                    break
                pos += len(chunk)
                data = carry + chunk
                cut = 0
                while lines < max_records:
                    nl = data.find(b"\n", cut)
                    if nl < 0:
                        break
                    line = data[cut:nl]
                    cut = nl + 1
                    lines += 1
                    if line.strip():
                        self._decode_line(line, records)
                carry = data[cut:]
            if lines == 0:
                self._pending = 0  # nothing left to read, whatever the counter said
            return SpillBatch(records=records, start=start, end=pos - len(carry), lines=lines)

    def commit(self, batch: SpillBatch) -> None:
        """Mark a batch from :meth:`read` as delivered; truncate or compact when worthwhile."""
        with self._lock:
            fd = self._require_open()
            if batch.start != self._head:
                raise ValueError("spill batch is stale (committed twice or out of order)")
            self._head = batch.end
            self._pending = max(0, self._pending - batch.lines)
            if self._head >= self._size:
                os.ftruncate(fd, 0)
                if self._fsync:
                    os.fsync(fd)
                self._head = self._size = self._pending = 0
            elif self._head >= self._compact_min_bytes and self._head * 2 >= self._size:
                self._compact_locked(fd)

    # -- internals -------------------------------------------------------------------------

    def _compact_path(self) -> Path:
        return self._path.with_name(self._path.name + ".compact")

    def _require_open(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"spill file {self._path} is not open")
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
        # Find the last newline; everything after it is a torn write.
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
            "billing spill %s ends in a torn line (%d bytes); moved to %s",
            self._path,
            len(torn),
            self.corrupt_path,
        )
        self._save_corrupt(torn)
        os.ftruncate(fd, keep)
        if self._fsync:
            os.fsync(fd)

    @staticmethod
    def _count_lines(fd: int, size: int) -> int:
        count = pos = 0
        while pos < size:
            chunk = os.pread(fd, min(_CHUNK * 16, size - pos), pos)
            if not chunk:
                break
            count += chunk.count(b"\n")
            pos += len(chunk)
        return count

    def _decode_line(self, line: bytes, out: list[UsageRecord]) -> None:
        try:
            out.append(decode_record(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            logger.error(
                "undecodable line in billing spill %s (%s); moved to %s",
                self._path,
                exc,
                self.corrupt_path,
            )
            self._save_corrupt(line)

    def _save_corrupt(self, data: bytes) -> None:
        if not data.endswith(b"\n"):
            data += b"\n"
        try:
            fd = os.open(self.corrupt_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            logger.exception("could not save corrupt spill data to %s", self.corrupt_path)

    def _compact_locked(self, fd: int) -> None:
        tmp = self._compact_path()
        new_fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _lock_fd(new_fd, tmp)
            pos = self._head
            while pos < self._size:
                chunk = os.pread(fd, min(_CHUNK * 16, self._size - pos), pos)
                if not chunk:
                    break
                _write_all(new_fd, chunk)
                pos += len(chunk)
            os.fsync(new_fd)
            os.replace(tmp, self._path)
            _fsync_dir(self._path.parent)
        except BaseException:
            os.close(new_fd)
            raise
        os.close(fd)
        self._fd = new_fd
        self._size -= self._head
        self._head = 0


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
            raise SpillFileLocked(
                f"billing spill file {path} is in use by another Biller or process; "
                "give each process its own spill_path"
            ) from None


def _fsync_dir(path: Path) -> None:
    if sys.platform == "win32":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
