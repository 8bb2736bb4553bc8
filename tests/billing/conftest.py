"""Shared helpers for the billing tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
import pytest

from responses_cache.billing import MarkEntry, OpenEntry, UsageRecord
from responses_cache.billing.journal import AckEntry, CloseEntry


def make_record(i: int, **overrides: object) -> UsageRecord:
    fields: dict[str, object] = {
        "response_id": f"resp_{i:06d}",
        "tenant": "tenant-a",
        "model": "gpt-oss-120b",
        "route": "engine-0",
        "status": "completed",
        "input_tokens": 100 + i,
        "cached_tokens": 50,
        "output_tokens": 20,
        "reasoning_tokens": 5,
        "created_at": 1_700_000_000.0 + i,
        "finished_at": 1_700_000_001.0 + i,
        "transport": "websocket",
        "previous_response_id": f"resp_{i - 1:06d}" if i else None,
    }
    fields.update(overrides)
    return UsageRecord(**fields)  # type: ignore[arg-type]


def ids(n: int, start: int = 0) -> set[str]:
    return {f"resp_{i:06d}" for i in range(start, start + n)}


class SinkDown(ConnectionError):
    pass


class MemorySink:
    """A controllable in-memory sink.

    ``down``: every write fails. ``fail_next``: the next N writes fail. ``partial``: a failing
    write stores the first half of its batch before raising (an ambiguous failure). ``gate``:
    writes wait for it to be set; ``entered`` is set when a write starts waiting.
    """

    def __init__(self) -> None:
        self.batches: list[list[UsageRecord]] = []
        self.calls = 0
        self.down = False
        self.fail_next = 0
        self.partial = False
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.in_write = False
        self.closed = False

    async def write(self, records: Sequence[UsageRecord]) -> None:
        self.calls += 1
        self.in_write = True
        try:
            if self.gate is not None:
                self.entered.set()
                await self.gate.wait()
            if self.fail_next > 0 or self.down:
                self.fail_next = max(0, self.fail_next - 1)
                if self.partial:
                    self.batches.append(list(records[: len(records) // 2]))
                raise SinkDown("sink is down")
            self.batches.append(list(records))
        finally:
            self.in_write = False

    async def close(self) -> None:
        self.closed = True

    @property
    def written(self) -> list[str]:
        """Every id written, duplicates included, in order."""
        return [r.response_id for batch in self.batches for r in batch]

    @property
    def unique(self) -> set[str]:
        return set(self.written)

    def duplicates(self) -> dict[str, int]:
        return {k: v for k, v in Counter(self.written).items() if v > 1}


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


async def wait_until(predicate: Callable[[], bool], *, limit: float = 10.0) -> None:
    """Poll until ``predicate()``; fail (instead of hanging) after ``limit`` seconds.

    A guard against hangs, not a timing assertion: fast or slow, the test passes the same.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.001)


def journal_ids(path: Path) -> list[str]:
    """Ids of the closed records in a journal not acknowledged by an ``ack`` entry (read
    without taking its lock; torn or corrupt lines skipped)."""
    if not path.exists():
        return []
    closed: list[str] = []
    acked: set[str] = set()
    for line in path.read_bytes().split(b"\n"):
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            entry = _entry_decoder.decode(line)
            if isinstance(entry, CloseEntry):
                closed.append(entry.record.response_id)
            elif isinstance(entry, AckEntry):
                acked.update(entry.ids)
    return [rid for rid in closed if rid not in acked]


_entry_decoder = msgspec.json.Decoder(OpenEntry | MarkEntry | CloseEntry | AckEntry)
