from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from responses_cache.billing import (
    BillingSink,
    CallableSink,
    JsonlSink,
    SqliteSink,
    UsageRecord,
    decode_record,
    encode_jsonl,
)

from .conftest import MemorySink, make_record


def jsonl_ids(path: Path) -> list[str]:
    return [decode_record(line).response_id for line in path.read_bytes().splitlines()]


def test_sinks_satisfy_the_protocol(tmp_path: Path) -> None:
    for sink in (
        JsonlSink(tmp_path / "a.jsonl"),
        SqliteSink(tmp_path / "a.db"),
        CallableSink(lambda records: None),
        MemorySink(),
    ):
        assert isinstance(sink, BillingSink)


# -- JsonlSink -------------------------------------------------------------------------------


async def test_jsonl_appends_and_dedupes(tmp_path: Path) -> None:
    path = tmp_path / "usage" / "usage.jsonl"
    sink = JsonlSink(path)
    await sink.write([make_record(0), make_record(1), make_record(1)])
    await sink.write([make_record(1), make_record(2)])
    await sink.close()
    assert jsonl_ids(path) == ["resp_000000", "resp_000001", "resp_000002"]
    assert decode_record(path.read_bytes().splitlines()[2]) == make_record(2)


async def test_jsonl_dedupes_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "usage.jsonl"
    first = JsonlSink(path)
    await first.write([make_record(i) for i in range(5)])
    await first.close()
    second = JsonlSink(path)
    await second.write([make_record(i) for i in range(3, 8)])
    await second.close()
    assert jsonl_ids(path) == [f"resp_{i:06d}" for i in range(8)]


async def test_jsonl_cuts_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "usage.jsonl"
    path.write_bytes(encode_jsonl([make_record(0)]) + encode_jsonl([make_record(1)])[:30])
    sink = JsonlSink(path, fsync=False)
    await sink.write([make_record(1)])  # the torn record was never acknowledged: write it
    await sink.close()
    assert jsonl_ids(path) == ["resp_000000", "resp_000001"]


async def test_jsonl_dedupe_window_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "usage.jsonl"
    sink = JsonlSink(path, dedupe_window=2, fsync=False)
    await sink.write([make_record(i) for i in range(4)])
    await sink.write([make_record(3)])  # still remembered
    await sink.write([make_record(0)])  # evicted: a retry this old is written again
    await sink.close()
    assert jsonl_ids(path).count("resp_000003") == 1
    assert jsonl_ids(path).count("resp_000000") == 2


# -- SqliteSink ------------------------------------------------------------------------------


async def test_sqlite_insert_or_ignore(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    sink = SqliteSink(path)
    await sink.write([make_record(i) for i in range(5)])
    await sink.write([make_record(i) for i in range(3, 9)])
    await sink.close()
    again = SqliteSink(path)  # reopening an existing table works
    await again.write([make_record(0), make_record(9)])
    await again.close()
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT response_id, input_tokens, previous_response_id, transport "
            "FROM usage_records ORDER BY response_id"
        ).fetchall()
    assert [r[0] for r in rows] == [f"resp_{i:06d}" for i in range(10)]
    assert rows[1] == ("resp_000001", 101, "resp_000000", "websocket")
    assert rows[0][2] is None


async def test_sqlite_recovered_flag_and_an_older_table(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    with sqlite3.connect(path) as conn:  # the table as an earlier version made it
        conn.execute("CREATE TABLE usage_records (response_id TEXT PRIMARY KEY NOT NULL, tenant TEXT NOT NULL, "
                     "model TEXT NOT NULL, route TEXT NOT NULL, status TEXT NOT NULL, input_tokens INTEGER NOT NULL, "
                     "cached_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, reasoning_tokens INTEGER NOT NULL, "
                     "created_at REAL NOT NULL, finished_at REAL NOT NULL, transport TEXT NOT NULL, "
                     "previous_response_id TEXT)")
        conn.execute("INSERT INTO usage_records VALUES ('old', 't', 'm', 'r', 'completed', 1, 0, 1, 0, 1.0, 2.0, 'http', NULL)")
    sink = SqliteSink(path)
    await sink.write([make_record(1, status="cancelled", recovered=True), make_record(2)])
    await sink.close()
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT response_id, recovered FROM usage_records ORDER BY response_id").fetchall()
    assert rows == [("old", 0), ("resp_000001", 1), ("resp_000002", 0)]


async def test_sqlite_custom_table_and_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SqliteSink(tmp_path / "x.db", table="usage; DROP TABLE x")
    sink = SqliteSink(tmp_path / "x.db", table="billing_2025")
    await sink.write([make_record(1)])
    await sink.close()
    with sqlite3.connect(tmp_path / "x.db") as conn:
        assert conn.execute("SELECT count(*) FROM billing_2025").fetchone() == (1,)


async def test_sqlite_failed_batch_is_rolled_back(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    sink = SqliteSink(path)
    await sink.write([make_record(0)])
    bad = make_record(1, tenant=None)  # violates NOT NULL
    with pytest.raises(sqlite3.IntegrityError):
        await sink.write([make_record(2), bad])
    await sink.write([make_record(2)])
    await sink.close()
    with sqlite3.connect(path) as conn:
        got = [r[0] for r in conn.execute("SELECT response_id FROM usage_records")]
    assert sorted(got) == ["resp_000000", "resp_000002"]


# -- CallableSink ----------------------------------------------------------------------------


async def test_callable_sync_function() -> None:
    got: list[UsageRecord] = []
    sink = CallableSink(got.extend)
    await sink.write([make_record(0), make_record(1)])
    await sink.write([make_record(1), make_record(2)])  # remembered ids are filtered
    assert [r.response_id for r in got] == ["resp_000000", "resp_000001", "resp_000002"]


async def test_callable_async_function_and_close() -> None:
    got: list[str] = []
    closed = asyncio.Event()

    async def store(records: list[UsageRecord]) -> None:
        await asyncio.sleep(0)
        got.extend(r.response_id for r in records)

    async def on_close() -> None:
        closed.set()

    sink = CallableSink(store, on_close=on_close)
    await sink.write([make_record(0)])
    await sink.close()
    assert got == ["resp_000000"]
    assert closed.is_set()


async def test_callable_to_thread() -> None:
    threads: list[int] = []

    def store(records: list[UsageRecord]) -> None:
        threads.append(threading.get_ident())

    await CallableSink(store, to_thread=True).write([make_record(0)])
    assert threads and threads[0] != threading.get_ident()


async def test_callable_failure_is_not_remembered() -> None:
    calls: list[list[str]] = []

    def flaky(records: list[UsageRecord]) -> None:
        calls.append([r.response_id for r in records])
        if len(calls) == 1:
            raise OSError("down")

    sink = CallableSink(flaky)
    with pytest.raises(OSError):
        await sink.write([make_record(0)])
    await sink.write([make_record(0)])
    assert calls == [["resp_000000"], ["resp_000000"]]


async def test_callable_dedupe_can_be_disabled() -> None:
    seen: list[Sequence[UsageRecord]] = []
    sink = CallableSink(seen.append, dedupe_window=0)
    await sink.write([make_record(0)])
    await sink.write([make_record(0)])
    assert len(seen) == 2
