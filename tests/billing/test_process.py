"""Real processes: SIGTERM under load, and recovery from the journal after SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from responses_cache.billing import Biller, JsonlSink, decode_record

from .conftest import MemorySink, ids, journal_ids

pytestmark = [pytest.mark.subprocess, pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]

REPO = Path(__file__).resolve().parents[2]

PRELUDE = textwrap.dedent(
    """
    import asyncio, signal, sys
    from responses_cache.billing import Biller, CallableSink, JsonlSink, UsageRecord

    def rec(i):
        return UsageRecord(
            response_id=f"resp_{i:06d}", tenant="t", model="m", route="r",
            status="completed", input_tokens=10, cached_tokens=5, output_tokens=3,
            reasoning_tokens=0, created_at=1.0, finished_at=2.0, transport="websocket",
        )
    """
)

SIGTERM_CHILD = PRELUDE + textwrap.dedent(
    """
    async def main(sink_path, journal_path):
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        biller = Biller(
            JsonlSink(sink_path), batch_size=64, flush_interval=0.001, journal_path=journal_path,
        )
        await biller.start()
        i = 0
        while not stop.is_set():
            biller.submit(rec(i))
            i += 1
            if i == 2000:
                print("ready", flush=True)
            if i % 20 == 0:
                await asyncio.sleep(0)
        await biller.stop()
        print(f"submitted {i}", flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)

SIGKILL_CHILD = PRELUDE + textwrap.dedent(
    """
    def down(records):
        raise ConnectionError("billing backend unreachable")

    async def main(journal_path):
        biller = Biller(CallableSink(down), journal_path=journal_path, flush_interval=0)
        await biller.start()
        for i in range(500):
            biller.submit(rec(i))
        assert not await biller.flush()  # the sink refused: everything waits in the journal
        print("journaled", flush=True)
        await asyncio.sleep(3600)  # killed here, without stop()

    asyncio.run(main(sys.argv[1]))
    """
)


def spawn(tmp_path: Path, source: str, *args: Path) -> subprocess.Popen[str]:
    script = tmp_path / "child.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(script), *map(str, args)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def wait_for_line(proc: subprocess.Popen[str], expected: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != expected:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"child said {line!r}, expected {expected!r}")


def test_sigterm_under_load_loses_nothing(tmp_path: Path) -> None:
    sink_path, journal_path = tmp_path / "usage.jsonl", tmp_path / "billing.journal"
    proc = spawn(tmp_path, SIGTERM_CHILD, sink_path, journal_path)
    wait_for_line(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    submitted = int(out.strip().rsplit(" ", 1)[1])
    assert submitted >= 2000

    in_sink = [decode_record(line).response_id for line in sink_path.read_bytes().splitlines()]
    assert len(in_sink) == len(set(in_sink))  # each record once
    assert set(in_sink) | set(journal_ids(journal_path)) == ids(submitted)

    # A restart that re-delivers records the file already holds (their ack lost in a crash): the
    # sink, reopened, dedupes them by id against the ids at the end of its file.
    stored = [decode_record(line) for line in sink_path.read_bytes().splitlines()]

    async def redeliver() -> None:
        sink = JsonlSink(sink_path)
        await sink.write(stored[-100:])
        await sink.close()

    asyncio.run(redeliver())
    assert [decode_record(line).response_id for line in sink_path.read_bytes().splitlines()] == in_sink


async def test_records_journaled_before_sigkill_are_delivered_after_restart(
    tmp_path: Path,
) -> None:
    journal_path = tmp_path / "billing.journal"
    proc = spawn(tmp_path, SIGKILL_CHILD, journal_path)
    try:
        wait_for_line(proc, "journaled")
    finally:
        proc.kill()
        proc.communicate()  # reaps the child and closes its pipe
    assert proc.returncode == -signal.SIGKILL

    sink = MemorySink()
    async with Biller(sink, journal_path=journal_path) as biller:
        assert await biller.flush()
    assert sink.unique == ids(500) and not sink.duplicates()
