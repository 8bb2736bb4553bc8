from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from responses_cache.billing import SpillFile, SpillFileLocked, encode_jsonl

from .conftest import make_record


def drain(spill: SpillFile, batch: int = 7) -> list[str]:
    out: list[str] = []
    while spill.pending:
        got = spill.read(batch)
        out.extend(r.response_id for r in got.records)
        spill.commit(got)
    return out


def test_append_read_commit_truncates_when_drained(tmp_path: Path) -> None:
    path = tmp_path / "spill.jsonl"
    with SpillFile(path) as spill:
        spill.append([make_record(i) for i in range(10)])
        spill.append([make_record(i) for i in range(10, 25)])
        assert spill.pending == 25
        first = spill.read(10)
        assert [r.response_id for r in first.records] == [f"resp_{i:06d}" for i in range(10)]
        assert spill.read(10) == first  # reading does not consume
        spill.commit(first)
        assert spill.pending == 15
        assert path.stat().st_size > 0
        rest = drain(spill)
        assert rest == [f"resp_{i:06d}" for i in range(10, 25)]
        assert spill.pending == 0
        assert path.stat().st_size == 0
        # appends after a truncation start at offset 0 again
        spill.append([make_record(99)])
        assert drain(spill) == ["resp_000099"]


def test_stale_commit_is_rejected(tmp_path: Path) -> None:
    with SpillFile(tmp_path / "s") as spill:
        spill.append([make_record(i) for i in range(4)])
        batch = spill.read(2)
        spill.commit(batch)
        with pytest.raises(ValueError):
            spill.commit(batch)


def test_reopen_counts_pending_records(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SpillFile(path) as spill:
        spill.append([make_record(i) for i in range(6)])
        spill.commit(spill.read(2))  # delivered but not compacted: replayed again after restart
    with SpillFile(path) as spill:
        assert spill.pending == 6
        assert len(drain(spill)) == 6


def test_compaction_keeps_undelivered_records(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SpillFile(path, compact_min_bytes=1) as spill:
        spill.append([make_record(i) for i in range(10)])
        size = path.stat().st_size
        spill.commit(spill.read(6))
        assert path.stat().st_size < size  # the delivered prefix is gone from disk
        assert not (tmp_path / "s.compact").exists()
        spill.append([make_record(10)])
        assert spill.pending == 5
    with SpillFile(path) as spill:
        assert drain(spill) == [f"resp_{i:06d}" for i in range(6, 11)]


def test_leftover_compaction_file_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "s"
    (tmp_path / "s.compact").write_bytes(b"partial copy")
    path.write_bytes(encode_jsonl([make_record(1)]))
    with SpillFile(path) as spill:
        assert spill.pending == 1
    assert not (tmp_path / "s.compact").exists()


def test_torn_last_line_is_cut_off_and_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "s"
    good = encode_jsonl([make_record(i) for i in range(3)])
    torn = encode_jsonl([make_record(3)])[:-20]
    path.write_bytes(good + torn)
    with SpillFile(path) as spill:
        assert spill.pending == 3
        spill.append([make_record(4)])  # starts on a fresh line
        assert drain(spill) == ["resp_000000", "resp_000001", "resp_000002", "resp_000004"]
        assert spill.corrupt_path.read_bytes() == torn + b"\n"


def test_corrupt_complete_line_is_skipped_and_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "s"
    path.write_bytes(
        encode_jsonl([make_record(0)]) + b'{"not": "a record"}\n' + encode_jsonl([make_record(1)])
    )
    with SpillFile(path) as spill:
        assert spill.pending == 3
        assert drain(spill) == ["resp_000000", "resp_000001"]
        assert spill.pending == 0
        assert b"not" in spill.corrupt_path.read_bytes()


def test_second_opener_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SpillFile(path):
        with pytest.raises(SpillFileLocked):
            SpillFile(path).open()
        with pytest.raises(SpillFileLocked):
            SpillFile(path).append([make_record(1)])
    SpillFile(path).open()  # released on close


def test_append_while_closed_is_one_shot(tmp_path: Path) -> None:
    path = tmp_path / "s"
    spill = SpillFile(path)
    spill.append([make_record(1)])
    spill.append([make_record(2)])
    assert not spill.is_open
    with SpillFile(path) as other:
        assert drain(other) == ["resp_000001", "resp_000002"]


def test_read_requires_open(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        SpillFile(tmp_path / "s").read(1)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(1, 12), cut=st.integers(0, 10_000))
def test_any_torn_tail_loses_only_the_torn_record(n: int, cut: int) -> None:
    """A crash at any byte of the last append leaves every earlier record readable."""
    data = encode_jsonl([make_record(i) for i in range(n)])
    last = encode_jsonl([make_record(n)])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s"
        path.write_bytes(data + last[: cut % (len(last) + 1)])
        with SpillFile(path, fsync=False) as spill:
            spill.append([make_record(1000)])
            got = drain(spill, batch=5)
        complete = cut % (len(last) + 1) == len(last)
        expected = [f"resp_{i:06d}" for i in range(n)]
        if complete:
            expected.append(f"resp_{n:06d}")
        assert got == [*expected, "resp_001000"]
        assert os.path.getsize(path) == 0
