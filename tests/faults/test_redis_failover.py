"""Issue #36, the store's primary killed: a ``responses-cache serve`` process on a
Sentinel-managed Redis (a primary, a replica, one Sentinel failing over after 500 ms without an
answer), two agents of the official SDK over WebSocket mode, ``SIGKILL`` to the primary mid-load
(:mod:`benchmarks.suite.failover`). The Sentinel promotes the replica; the store's commands wait
for it (redis-py's retry, about 6 s), so a turn a client saw fail could only have failed with
``store_unavailable`` (503, "try again"); turns work after it; every response completed, before
the kill or while no primary answered, is read back from the store by the other process; every
completed response is billed exactly once, and no other."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.suite.failover import run

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
