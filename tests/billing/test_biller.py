"""Biller: batching, overlap with the caller, outages, the journal, restart and shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from responses_cache.billing import (
    Biller,
    CallableSink,
    JournalLocked,
    JsonlSink,
    OpenEntry,
    UsageJournal,
    UsageRecord,
    decode_record,
)

from .conftest import MemorySink, SinkDown, ids, journal_ids, make_record, wait_until

# -- batching and overlap --------------------------------------------------------------------


async def test_batches_respect_batch_size(sink: MemorySink) -> None:
    async with Biller(sink, batch_size=10, flush_interval=60) as biller:
        for i in range(95):
            biller.submit(make_record(i))
        assert await biller.flush()
        assert [len(b) for b in sink.batches] == [10] * 9 + [5]
        assert sink.written == sorted(ids(95))  # FIFO
    assert biller.stats().delivered == 95


async def test_partial_batch_is_written_after_flush_interval(sink: MemorySink) -> None:
    async with Biller(sink, batch_size=100, flush_interval=0.01) as biller:
        for i in range(3):
            biller.submit(make_record(i))
        await wait_until(lambda: bool(sink.batches))
        assert [len(b) for b in sink.batches] == [3]


async def test_full_batch_is_written_without_waiting_for_the_interval(sink: MemorySink) -> None:
    async with Biller(sink, batch_size=5, flush_interval=3600) as biller:
        for i in range(5):
            biller.submit(make_record(i))
        await wait_until(lambda: bool(sink.batches))
        assert [len(b) for b in sink.batches] == [5]


async def test_submit_returns_while_the_sink_is_blocked(sink: MemorySink) -> None:
    sink.gate = asyncio.Event()
    async with Biller(sink, batch_size=8, flush_interval=0) as biller:
        biller.submit(make_record(0))
        await sink.entered.wait()  # the worker is inside sink.write, blocked on the gate
        for i in range(1, 500):
            biller.submit(make_record(i))  # would deadlock if submit waited for the sink
        assert sink.in_write and not sink.batches
        assert biller.submitted == 500 and biller.pending == 500
        sink.gate.set()
        assert await biller.flush()
    assert sink.unique == ids(500) and not sink.duplicates()


async def test_turns_overlap_a_slow_sink() -> None:
    """Each write sleeps 200 ms; turns keep submitting while a write is in progress."""
    log: list[str] = []

    async def slow(records: list[UsageRecord]) -> None:
        log.append("write-start")
        await asyncio.sleep(0.2)
        log.append(f"write-end:{len(records)}")

    async with Biller(CallableSink(slow), batch_size=100, flush_interval=0) as biller:
        biller.submit(make_record(0))
        await wait_until(lambda: "write-start" in log)
        for i in range(1, 10):
            await asyncio.sleep(0)  # the turn's own work
            biller.submit(make_record(i))
            log.append(f"turn:{i}")
    first_end = next(n for n, e in enumerate(log) if e.startswith("write-end"))
    assert log[0] == "write-start"
    assert "turn:1" in log[:first_end]  # submit() returned while the sink was still writing
    assert sum(int(e.split(":")[1]) for e in log if e.startswith("write-end")) == 10


# -- outages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("use_journal", [True, False], ids=["journal", "memory"])
async def test_sink_down_for_many_batches_then_back(
    sink: MemorySink, tmp_path: Path, use_journal: bool
) -> None:
    journal_path = tmp_path / "billing.journal" if use_journal else None
    sink.down = True
    biller = Biller(
        sink,
        batch_size=10,
        flush_interval=0,
        retry_interval=0.001,
        max_retry_interval=0.004,
        journal_path=journal_path,
    )
    async with biller:
        for i in range(300):
            biller.submit(make_record(i))
            if i % 25 == 24:
                assert not await biller.flush()
        stats = biller.stats()
        assert stats.degraded and stats.pending == 300 and stats.sink_errors >= 12
        if journal_path is not None:
            assert sorted(journal_ids(journal_path)) == sorted(ids(300))  # waiting on disk
            assert stats.in_memory == 0
        else:
            assert stats.in_memory == 300
        calls = sink.calls
        await wait_until(lambda: sink.calls > calls + 2)  # retried on its own, with backoff
        sink.down = False
        await wait_until(lambda: biller.pending == 0)  # recovered without a flush()
        assert not biller.stats().degraded
    assert sink.unique == ids(300)
    assert not sink.duplicates()
    if journal_path is not None:
        assert journal_path.stat().st_size == 0  # all delivered, no response open: truncated


class HalfThenFail:
    """In front of a real sink: the first ``failures`` writes store half their batch there and then
    fail (an ambiguous failure: the Biller cannot know what was stored)."""

    def __init__(self, inner: JsonlSink, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.offered: list[str] = []

    async def write(self, records: Sequence[UsageRecord]) -> None:
        self.offered += [r.response_id for r in records]
        if self.failures > 0:
            self.failures -= 1
            await self.inner.write(records[: len(records) // 2])
            raise SinkDown("stored half, then failed")
        await self.inner.write(records)

    async def close(self) -> None:
        await self.inner.close()


async def test_ambiguous_failures_are_deduplicated_by_id(tmp_path: Path) -> None:
    """A write that stored half its batch and then failed is retried whole (at-least-once), and
    the sink's dedupe by ``response_id`` stores each record once (exactly-once)."""
    path = tmp_path / "usage.jsonl"
    sink = HalfThenFail(JsonlSink(path, fsync=False), failures=6)
    async with Biller(sink, batch_size=10, flush_interval=0, retry_interval=0.001) as biller:
        for i in range(100):
            biller.submit(make_record(i))
        while not await biller.flush():
            pass
    assert len(sink.offered) > 100  # the half-stored batches were offered again
    stored = [decode_record(line).response_id for line in path.read_bytes().splitlines()]
    assert sorted(stored) == sorted(ids(100))  # each exactly once


async def test_sink_exceptions_of_any_type_are_failures(tmp_path: Path) -> None:
    got: list[str] = []

    def buggy(records: list[UsageRecord]) -> None:
        if not got:
            got.append("failed once")
            raise TypeError("bug in the sink")
        got.extend(r.response_id for r in records)

    sink = CallableSink(buggy)
    async with Biller(sink, journal_path=tmp_path / "j", flush_interval=0) as biller:
        biller.submit(make_record(1))
        assert not await biller.flush()
        assert await biller.flush()
    assert got == ["failed once", "resp_000001"]


async def test_journal_write_failure_falls_back_to_memory(
    sink: MemorySink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Disk full while the sink is down: records wait in memory instead of being dropped."""
    sink.down = True
    biller = Biller(sink, journal_path=tmp_path / "billing.journal", flush_interval=0, queue_size=5)
    async with biller:
        journal = biller.journal
        assert journal is not None

        def disk_full(record: UsageRecord) -> int:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(journal, "append_close", disk_full)
        for i in range(20):
            biller.submit(make_record(i))
        assert not await biller.flush()
        assert biller.stats().in_memory == 20 and biller.pending == 20
        sink.down = False
        assert await biller.flush()
    assert sink.unique == ids(20) and not sink.duplicates()


async def test_records_ended_before_start_are_journaled_at_start(sink: MemorySink, tmp_path: Path) -> None:
    journal_path = tmp_path / "billing.journal"
    sink.down = True
    biller = Biller(sink, journal_path=journal_path, flush_interval=0)
    for i in range(10):  # not started yet: held in memory
        biller.submit(make_record(i))
    assert biller.stats().in_memory == 10
    async with biller:
        assert biller.stats().in_memory == 0
        assert sorted(journal_ids(journal_path)) == sorted(ids(10))
        sink.down = False
        assert await biller.flush()
    assert sink.unique == ids(10)


async def test_without_a_journal_records_wait_in_memory(sink: MemorySink) -> None:
    biller = Biller(sink, queue_size=10)
    for i in range(100):
        biller.submit(make_record(i))
    assert biller.stats().in_memory == 100 and biller.pending == 100
    async with biller:
        assert await biller.flush()
    assert sink.unique == ids(100)


# -- the journal: begin, progress marks, end, restart ----------------------------------------


def open_entry(i: int) -> OpenEntry:
    return OpenEntry(
        id=f"resp_{i:06d}", tenant="tenant-a", model="gpt-oss-120b", route="engine-0",
        created_at=1_700_000_000.0 + i, input_tokens=100 + i, cached_tokens=50, transport="websocket",
    )


async def test_records_left_by_a_stopped_biller_are_delivered_by_the_next(
    tmp_path: Path,
) -> None:
    journal_path = tmp_path / "billing.journal"
    down = MemorySink()
    down.down = True
    first = Biller(down, journal_path=journal_path, flush_interval=0, batch_size=7, stop_timeout=0.05)
    async with first:
        for i in range(50):
            first.submit(make_record(i))
    assert first.pending == 50 and down.closed
    assert sorted(journal_ids(journal_path)) == sorted(ids(50))

    up = MemorySink()
    async with Biller(up, journal_path=journal_path) as second:
        assert await second.flush()
        assert second.delivered == 50
    assert up.unique == ids(50) and not up.duplicates()
    assert journal_path.stat().st_size == 0


async def test_open_responses_are_billed_as_cancelled_after_a_crash(tmp_path: Path) -> None:
    """A process that died with responses in flight: the next start bills them from their
    open entry and last progress mark, flagged as recovered; a closed one keeps its record."""
    journal_path = tmp_path / "billing.journal"
    crashed = UsageJournal(journal_path)
    crashed.open()
    crashed.append_open(open_entry(1))
    crashed.append_open(open_entry(2))
    crashed.append_open(open_entry(3))
    from responses_cache.billing import MarkEntry

    crashed.append_mark(MarkEntry("resp_000001", 40, 10, 1_700_000_005.0))
    crashed.append_mark(MarkEntry("resp_000001", 90, 10, 1_700_000_006.0))
    crashed.append_close(make_record(3, output_tokens=77))
    os.close(crashed._fd)  # type: ignore[arg-type]  # the process is gone: no close(), no ack

    sink = MemorySink()
    async with Biller(sink, journal_path=journal_path) as biller:
        assert await biller.flush()
        assert biller.stats().recovered == 2
    by_id = {r.response_id: r for r in sink.batches[0] + sink.batches[-1]}
    assert set(by_id) == {"resp_000001", "resp_000002", "resp_000003"}
    one, two, three = by_id["resp_000001"], by_id["resp_000002"], by_id["resp_000003"]
    assert one.status == two.status == "cancelled" and one.recovered and two.recovered
    assert (one.input_tokens, one.cached_tokens, one.output_tokens, one.reasoning_tokens) == (101, 50, 90, 10)
    assert one.finished_at == 1_700_000_006.0 and one.transport == "websocket"
    assert (two.output_tokens, two.finished_at) == (0, two.created_at)
    assert three.status == "completed" and three.output_tokens == 77 and not three.recovered


async def test_progress_and_end_in_process_mode_need_no_await(sink: MemorySink, tmp_path: Path) -> None:
    async with Biller(sink, journal_path=tmp_path / "j", flush_interval=0) as biller:
        assert biller.begin(open_entry(1)) is None
        biller.progress("resp_000001", 12, 3)
        assert biller.stats().open_responses == 1
        assert biller.end(make_record(1)) is None
        assert biller.stats().open_responses == 0
        assert await biller.flush()
    assert sink.unique == {"resp_000001"}


async def test_machine_mode_awaits_a_group_commit(
    sink: MemorySink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        syncs.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    biller = Biller(sink, journal_path=tmp_path / "j", durability="machine", flush_interval=0)
    async with biller:
        journal = biller.journal
        assert journal is not None
        begun = [biller.begin(open_entry(i)) for i in range(20)]
        assert all(w is not None for w in begun)
        await asyncio.gather(*(w for w in begun if w is not None))
        assert journal.synced == journal.appended  # every open entry is on disk
        ended = [biller.end(make_record(i)) for i in range(20)]
        written = journal.appended
        await asyncio.gather(*(w for w in ended if w is not None))
        assert journal.synced >= written  # every close entry too (acks may follow later)
        assert 1 <= len(syncs) < 40  # group commit: fewer syncs than appends
        assert await biller.flush()
    assert sink.unique == ids(20)


async def test_acknowledged_records_are_compacted_away(sink: MemorySink, tmp_path: Path) -> None:
    """Under steady load some response is always open; compaction still bounds the file."""
    journal_path = tmp_path / "billing.journal"
    async with Biller(sink, journal_path=journal_path, flush_interval=0, batch_size=50) as biller:
        journal = biller.journal
        assert journal is not None
        journal._compact_min_bytes = 16 * 1024
        biller.begin(open_entry(0))  # stays open throughout
        for i in range(1, 3000):
            biller.begin(open_entry(i))
            biller.progress(f"resp_{i:06d}", 5)
            biller.end(make_record(i))
            if i % 100 == 0:
                assert await biller.flush()
        assert await biller.flush()
        assert journal_path.stat().st_size < 64 * 1024
        assert journal.live == 1
    assert sink.unique == ids(2999, start=1) and not sink.duplicates()
    # the open response survived compaction: the next start bills it as recovered
    after = MemorySink()
    async with Biller(after, journal_path=journal_path) as second:
        assert await second.flush()
    assert after.unique == {"resp_000000"} and after.batches[0][0].recovered


async def test_crashed_journal_with_torn_tail_is_replayed(sink: MemorySink, tmp_path: Path) -> None:
    """The file a crashed process left: complete lines, then half a line."""
    journal_path = tmp_path / "billing.journal"
    journal = UsageJournal(journal_path)
    journal.open()
    for i in range(20):
        journal.append_close(make_record(i))
    journal.close()
    with journal_path.open("ab") as f:
        f.write(b'{"t":"close","record":{"response_id":"resp_torn","ten')
    async with Biller(sink, journal_path=journal_path) as biller:
        assert await biller.flush()
    assert sink.unique == ids(20)
    assert b"resp_torn" in (tmp_path / "billing.journal.corrupt").read_bytes()


async def test_acked_records_are_not_delivered_again_after_a_crash(tmp_path: Path) -> None:
    journal_path = tmp_path / "billing.journal"
    first = MemorySink()
    biller = Biller(first, journal_path=journal_path, flush_interval=0, batch_size=10)
    await biller.start()
    biller.begin(open_entry(999))  # keeps the file from being truncated
    for i in range(30):
        biller.submit(make_record(i))
    assert await biller.flush()
    first.down = True
    for i in range(30, 40):
        biller.submit(make_record(i))
    assert not await biller.flush()
    journal = biller.journal
    assert journal is not None
    os.close(journal._fd)  # type: ignore[arg-type]  # crash
    journal._fd = None
    second = MemorySink()
    async with Biller(second, journal_path=journal_path) as after:
        assert await after.flush()
    assert second.unique == ids(10, start=30) | {"resp_000999"}


async def test_one_journal_per_process(tmp_path: Path) -> None:
    journal_path = tmp_path / "billing.journal"
    async with Biller(MemorySink(), journal_path=journal_path):
        second = Biller(MemorySink(), journal_path=journal_path)
        with pytest.raises(JournalLocked, match="in use by another process"):
            await second.start()
        with pytest.raises(JournalLocked):
            UsageJournal.probe(journal_path)


# -- shutdown --------------------------------------------------------------------------------


async def test_stop_flushes_everything(sink: MemorySink) -> None:
    biller = Biller(sink, batch_size=64, flush_interval=3600)
    await biller.start()
    for i in range(1000):
        biller.submit(make_record(i))
    await biller.stop()
    assert sink.unique == ids(1000) and not sink.duplicates()
    assert sink.closed and biller.pending == 0


async def test_stop_is_idempotent(sink: MemorySink) -> None:
    closes = 0

    async def count_close() -> None:
        nonlocal closes
        closes += 1

    sink.close = count_close  # type: ignore[method-assign]
    biller = Biller(sink)
    await biller.start()
    biller.submit(make_record(1))
    await asyncio.gather(biller.stop(), biller.stop())
    await biller.stop()
    assert closes == 1 and sink.unique == {"resp_000001"}
    with pytest.raises(RuntimeError):
        await biller.start()


@pytest.mark.parametrize("down", [False, True])
async def test_stop_without_start_delivers_or_journals(tmp_path: Path, down: bool) -> None:
    journal_path = tmp_path / "billing.journal"
    sink = MemorySink()
    sink.down = down
    biller = Biller(sink, journal_path=journal_path, stop_timeout=0.05)
    biller.submit(make_record(1))
    await biller.stop()
    assert sink.closed
    assert journal_ids(journal_path) == (["resp_000001"] if down else [])
    assert sink.unique == (set() if down else {"resp_000001"})


async def test_stop_without_start_or_records_just_closes() -> None:
    sink = MemorySink()
    biller = Biller(sink)
    await biller.stop()
    await biller.stop()
    assert sink.closed and sink.calls == 0


async def test_stop_with_a_hung_sink_leaves_records_in_the_journal(tmp_path: Path) -> None:
    journal_path = tmp_path / "billing.journal"
    hung = MemorySink()
    hung.gate = asyncio.Event()  # never set
    biller = Biller(hung, batch_size=8, flush_interval=0, journal_path=journal_path)
    await biller.start()
    for i in range(20):
        biller.submit(make_record(i))
    await hung.entered.wait()
    await biller.stop(timeout=0.01)
    assert not hung.batches and hung.closed
    assert sorted(journal_ids(journal_path)) == sorted(ids(20))

    up = MemorySink()
    async with Biller(up, journal_path=journal_path) as after:
        assert await after.flush()
    assert up.unique == ids(20)


async def test_submit_after_stop_is_journaled(sink: MemorySink, tmp_path: Path) -> None:
    journal_path = tmp_path / "billing.journal"
    biller = Biller(sink, journal_path=journal_path)
    async with biller:
        pass
    biller.submit(make_record(7))  # e.g. a response that finished during shutdown
    assert journal_ids(journal_path) == ["resp_000007"]


async def test_undeliverable_records_without_a_journal_are_logged(
    sink: MemorySink, caplog: pytest.LogCaptureFixture
) -> None:
    sink.down = True
    biller = Biller(sink, flush_interval=0, stop_timeout=0.05)
    with caplog.at_level(logging.ERROR, logger="responses_cache.billing"):
        async with biller:
            biller.submit(make_record(1))
        biller.submit(make_record(2))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert '"response_id":"resp_000001"' in logged
    assert '"response_id":"resp_000002"' in logged
    assert biller.pending == 2


async def test_shutdown_under_load_loses_nothing(tmp_path: Path) -> None:
    """Threads and the loop keep submitting while stop() runs (a SIGTERM under load)."""
    journal_path = tmp_path / "billing.journal"
    sink = MemorySink()
    biller = Biller(sink, batch_size=32, flush_interval=0, journal_path=journal_path)
    submitted: list[list[str]] = [[] for _ in range(4)]
    halt = threading.Event()
    started = threading.Barrier(5)

    def producer(n: int) -> None:
        started.wait()
        i = 0
        while not halt.is_set() and i < 5000:
            record = make_record(n * 100_000 + i)
            biller.submit(record)
            submitted[n].append(record.response_id)
            i += 1

    await biller.start()
    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    await asyncio.to_thread(started.wait)
    for i in range(2000):
        biller.submit(make_record(900_000 + i))
        if i % 100 == 0:
            await asyncio.sleep(0)
    await biller.stop()
    halt.set()
    for t in threads:
        t.join()

    expected = {f"resp_{900_000 + i:06d}" for i in range(2000)}
    for batch in submitted:
        expected.update(batch)
    assert biller.submitted == len(expected)
    assert not sink.duplicates()
    assert sink.unique | set(journal_ids(journal_path)) == expected


def test_worker_cancelled_without_stop_loses_nothing(tmp_path: Path) -> None:
    """A loop torn down without stop() (asyncio.run exiting): the records are in the journal."""
    journal_path = tmp_path / "billing.journal"

    async def forgetful() -> None:
        hung = MemorySink()
        hung.gate = asyncio.Event()
        biller = Biller(hung, batch_size=8, flush_interval=0, journal_path=journal_path)
        await biller.start()
        for i in range(30):
            biller.submit(make_record(i))
        await hung.entered.wait()
        # returns without stop(): asyncio.run cancels the worker

    asyncio.run(forgetful())
    assert sorted(journal_ids(journal_path)) == sorted(ids(30))


# -- integration -----------------------------------------------------------------------------


def test_asgi_lifespan(tmp_path: Path) -> None:
    sink = MemorySink()
    biller = Biller(sink, journal_path=tmp_path / "billing.journal")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with biller:
            yield

    async def turn(request: Request) -> JSONResponse:
        n = int(request.path_params["n"])
        biller.submit(make_record(n))
        return JSONResponse({"id": f"resp_{n:06d}"})

    app = Starlette(routes=[Route("/turn/{n}", turn, methods=["POST"])], lifespan=lifespan)
    with TestClient(app) as client:
        for n in range(25):
            assert client.post(f"/turn/{n}").status_code == 200
    assert sink.unique == ids(25) and sink.closed


async def test_validation() -> None:
    sink = MemorySink()
    for kwargs in (
        {"queue_size": 0},
        {"batch_size": 0},
        {"flush_interval": -1},
        {"retry_interval": 0},
        {"retry_interval": 2, "max_retry_interval": 1},
        {"stop_timeout": -1},
        {"commit_interval": -1},
        {"durability": "disk"},
        {"durability": "machine"},  # without a journal
    ):
        with pytest.raises(ValueError):
            Biller(sink, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        await Biller(sink).flush()


# -- property: any failure schedule, any sizes -> every id, exactly once ---------------------


class ScheduledSink:
    def __init__(self, schedule: Sequence[bool]) -> None:
        self.schedule = list(schedule)
        self.calls = 0
        self.written: list[str] = []

    async def write(self, records: Sequence[UsageRecord]) -> None:
        fail = self.calls < len(self.schedule) and self.schedule[self.calls]
        self.calls += 1
        if fail:
            raise ConnectionError("scheduled failure")
        self.written.extend(r.response_id for r in records)

    async def close(self) -> None:
        pass


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    n=st.integers(0, 150),
    batch_size=st.integers(1, 40),
    queue_size=st.integers(1, 60),
    schedule=st.lists(st.booleans(), max_size=30),
    flush_every=st.integers(1, 60),
    use_journal=st.booleans(),
)
def test_every_record_delivered_exactly_once(
    n: int,
    batch_size: int,
    queue_size: int,
    schedule: list[bool],
    flush_every: int,
    use_journal: bool,
) -> None:
    async def scenario(journal_path: Path | None) -> ScheduledSink:
        sink = ScheduledSink(schedule)
        biller = Biller(
            sink,
            batch_size=batch_size,
            queue_size=queue_size,
            flush_interval=0,
            retry_interval=0.001,
            max_retry_interval=0.002,
            journal_path=journal_path,
        )
        async with biller:
            for i in range(n):
                biller.begin(open_entry(i))
                biller.progress(f"resp_{i:06d}", 1)
                biller.submit(make_record(i))
                if i % flush_every == 0:
                    await biller.flush()
            for _ in range(len(schedule) + 2):
                if await biller.flush():
                    break
            assert biller.pending == 0
        return sink

    with tempfile.TemporaryDirectory() as tmp:
        sink = asyncio.run(scenario(Path(tmp) / "billing.journal" if use_journal else None))
    assert sorted(sink.written) == sorted(ids(n))  # every id, none twice


# -- property: a crash anywhere -> every begun response billed, ended ones as they ended ------


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.tuples(st.sampled_from(["begin", "mark", "end", "flush", "down", "up"]), st.integers(0, 19)),
    max_size=120),
    batch_size=st.integers(1, 8),
    queue_size=st.integers(1, 12),
    compact_at=st.sampled_from([256, 1 << 20]),
)
def test_a_crash_at_any_point_bills_every_begun_response(
    ops: list[tuple[str, int]], batch_size: int, queue_size: int, compact_at: int
) -> None:
    async def scenario(path: Path) -> tuple[MemorySink, set[int], dict[int, int]]:
        sink = MemorySink()
        biller = Biller(sink, journal_path=path, batch_size=batch_size, queue_size=queue_size, flush_interval=3600)
        await biller.start()
        journal = biller.journal
        assert journal is not None
        journal._compact_min_bytes = compact_at
        begun: set[int] = set()
        ended: set[int] = set()
        marks: dict[int, int] = {}
        for op, i in ops:
            if op == "begin" and i not in begun:
                begun.add(i)
                biller.begin(open_entry(i))
            elif op == "mark" and i in begun and i not in ended:
                marks[i] = marks.get(i, 0) + 7
                biller.progress(f"resp_{i:06d}", marks[i], 1)
            elif op == "end" and i in begun and i not in ended:
                ended.add(i)
                biller.end(make_record(i))
            elif op == "flush":
                await biller.flush()
            else:
                sink.down = op == "down"
        # crash: the worker and the file vanish without stop()
        assert biller._worker is not None
        biller._worker.cancel()
        os.close(journal._fd)  # type: ignore[arg-type]
        journal._fd = None
        after = MemorySink()
        async with Biller(after, journal_path=path, batch_size=batch_size) as second:
            assert await second.flush()
        both = MemorySink()
        both.batches = sink.batches + after.batches
        open_marks = {i: marks.get(i, 0) for i in begun - ended}
        return both, ended, open_marks

    with tempfile.TemporaryDirectory() as tmp:
        sink, ended, open_marks = asyncio.run(scenario(Path(tmp) / "billing.journal"))
    records: dict[str, list[UsageRecord]] = {}
    for batch in sink.batches:
        for r in batch:
            records.setdefault(r.response_id, []).append(r)
    assert set(records) == {f"resp_{i:06d}" for i in ended | set(open_marks)}
    for copies in records.values():
        assert all(c == copies[0] for c in copies)  # a repeat is the very same record
    for i in ended:
        assert records[f"resp_{i:06d}"][0] == make_record(i)
    for i, tokens in open_marks.items():
        record = records[f"resp_{i:06d}"][0]
        assert record.status == "cancelled" and record.recovered and record.output_tokens == tokens
