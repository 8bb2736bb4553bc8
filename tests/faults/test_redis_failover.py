"""Issue #36, the store's primary killed: a ``responses-cache serve`` process on a
Sentinel-managed Redis (a primary, a replica, one Sentinel failing over after 500 ms without an
answer), two agents of the official SDK over WebSocket mode, ``SIGKILL`` to the primary mid-load
(:mod:`benchmarks.suite.failover`). The Sentinel promotes the replica; the store's commands wait
for it (redis-py's retry, about 6 s), so a turn a client saw fail could only have failed with
``store_unavailable`` (503, "try again"); turns work after it; every response completed, before
the kill or while no primary answered, is read back from the store by the other process; every
completed response is billed exactly once, and no other. And the real Codex CLI through the same
failover: its task finishes, no turn fails, one usage record per response."""

from __future__ import annotations

import math
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from benchmarks.suite.deployment import KEY, Deployment
from benchmarks.suite.failover import run
from benchmarks.suite.redisproc import SentinelProcess
from responses_cache.testing import wait_for
from tests.codex_cli import codex_binary, running, start_codex

pytestmark = [pytest.mark.subprocess]


@pytest.mark.timeout(120)
def test_a_sentinel_failover_under_agent_load(tmp_path: Path) -> None:
    report = run(
        agents=2, processes=1, turns_before=1, turns_after=2, down_after_ms=500, work_dir=tmp_path, timeout_s=30
    )
    print(report.summary())  # the measurement (time to recover, failures, unstored) in -s output
    assert not math.isnan(report.promoted_after_s), "the Sentinel promoted no replica"
    assert {(f.kind, f.code, f.status) for f in report.failures} <= {("error", "store_unavailable", 503)}
    assert report.lost_before_kill == []
    assert report.unstored_after_kill == []  # completed while no primary answered, stored all the same
    assert report.records_missing == [] and report.records_doubled == []
    assert report.records_other == {}


@pytest.mark.npm
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_codex_cli_finishes_its_task_through_a_sentinel_failover(tmp_path: Path) -> None:
    """While Codex runs the task's command (``sleep 2``) the primary is killed; the Sentinel
    (``down-after-milliseconds`` 5000) promotes the replica only after Codex has sent the
    command's output, so that turn runs while the store has no primary at all. Codex keeps its
    WebSocket connection and sends ``store: false``: its continuation is in the connection's
    cache, and none of its turns touches the store, so none waits for the promotion
    (docs/deploy.md, Faults)."""
    cli = codex_binary()
    marker = "hello-from-a-failover"
    command = f"sleep 2; echo {marker}"
    promoted: list[float] = []
    with SentinelProcess(replicas=1, down_after_ms=5000, failover_timeout_ms=2000) as redis:
        # info: where a stop hangs, uvicorn's shutdown steps in the log say which one
        deployment = Deployment(tmp_path, redis.url, tokens_per_s=200.0, count=1, log_level="info")
        try:
            server = deployment.start(0)
            codex = start_codex(cli, server.http_url, tmp_path, f"Run `{command}` and tell me the output.", api_key=KEY)
            try:
                wait_for(lambda: running(command), "Codex running the task's command", timeout=60)
                killed_port = redis.kill_primary()
                killed_at = time.time()
                watcher = threading.Thread(
                    target=lambda: promoted.extend([time.time()] if redis.wait_promoted(killed_port, 30) else []),
                    daemon=True,
                )
                watcher.start()
                out, err = codex.communicate(timeout=90)
            finally:
                if codex.poll() is None:
                    codex.kill()
                    codex.communicate()
            watcher.join()
            server.proc.send_signal(signal.SIGTERM)
            try:
                assert server.proc.wait(40) == 0
            except subprocess.TimeoutExpired:
                raise AssertionError(f"serve did not stop 40 s after SIGTERM; its log ends:\n{server.output()[-3000:]}") from None
        finally:
            deployment.stop()
    assert promoted, "the Sentinel promoted no replica"
    assert codex.returncode == 0, err[-3000:]
    assert marker in out
    assert "Falling back" not in err  # it stayed on WebSocket mode
    records = deployment.records()
    ids = [record["response_id"] for record in records]
    assert len(ids) == len(set(ids)) and len(ids) >= 3, records  # warm-up, call, answer: once each
    assert {record["status"] for record in records} == {"completed"}
    assert {record["transport"] for record in records} == {"websocket"}
    # The turn with the command's output ran after the kill and before the promotion: it did not
    # wait for the store.
    answer = max(records, key=lambda record: record["finished_at"])
    timing = {"answer_after_kill_s": answer["created_at"] - killed_at, "promoted_after_kill_s": promoted[0] - killed_at}
    print(timing)
    assert 0 < timing["answer_after_kill_s"] < timing["promoted_after_kill_s"], timing
