"""Smoke test of ``python -m benchmarks.suite``: every scenario at a tiny size, checking the outputs'
shape (never the figures: speed lives in the benchmark itself, not in assertions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.suite import SCENARIOS
from benchmarks.suite import main as suite_main
from benchmarks.suite.agent import MODES
from benchmarks.suite.compare import lanes, rotated
from benchmarks.suite.runner import ServerSpec
from benchmarks.suite.server import ROOT, ServerProcess
from benchmarks.suite.stats import bucket_of, percentile

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

TINY = [
    "--no-progress",
    "--target-tokens", "3000", "--tokens-per-turn", "1000", "--repeats", "1",
    "--tool-calls", "2", "--rollout-repeats", "1", "--output-tps", "100000", "--prefill-tps", "10000000",
    "--connections", "3", "--context-tokens", "400", "--scale-turns", "2",
    "--tiers-target-tokens", "2000", "--tiers-samples", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("bench")
    code = suite_main(["--out", str(out), *TINY])
    assert code == 0
    return json.loads((out / "results.json").read_text()), out


def test_writes_json_and_plot(results: tuple[dict[str, Any], Path]) -> None:
    data, out = results
    assert set(SCENARIOS) <= data.keys()
    assert data["meta"]["command"].startswith("python -m benchmarks.suite")
    assert (out / "overhead.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_overhead_shape(results: tuple[dict[str, Any], Path]) -> None:
    overhead = results[0]["overhead"]
    modes = {s["mode"] for s in overhead["samples"]}
    assert modes == {"http_full", "http_prev", "ws"}
    sample = overhead["samples"][0]
    assert {"history_tokens", "first_event_ms", "completed_ms", "turn"} <= sample.keys()
    assert all(s["first_event_ms"] <= s["completed_ms"] for s in overhead["samples"])
    bucket = overhead["summary"]["buckets"][0]
    assert {"bucket", "ws_first_p50_ms", "http_full_first_p50_ms", "full_over_ws"} <= bucket.keys()


def test_rollout_shape(results: tuple[dict[str, Any], Path]) -> None:
    rollout = results[0]["rollout"]
    assert {r["mode"] for r in rollout["runs"]} == {"http_full", "http_prev", "ws"}
    assert all(r["tool_calls"] == 2 and r["turns"] == 3 for r in rollout["runs"])
    ws = rollout["summary"]["ws"]
    assert ws["floor_s_p50"] > 0 and ws["wall_s_p50"] > 0


def test_scale_shape(results: tuple[dict[str, Any], Path]) -> None:
    scale = results[0]["scale"]
    assert scale["connections"] == 3
    assert scale["errors"] == 0, scale["error_samples"]
    assert scale["turns_total"] == 6
    assert scale["cached_tokens"] > 0
    assert scale["after_build"]["footprint"]["sessions"] >= 3


def test_targets_listed(results: tuple[dict[str, Any], Path]) -> None:
    targets = results[0]["targets"]
    assert len(targets) == 7  # six targets, plus the scale test's RSS growth for context
    assert all({"target", "measured", "met"} <= t.keys() for t in targets)
    assert [t["met"] is None for t in targets].count(True) == 1


def test_helpers() -> None:
    assert (
        bucket_of(0) == "<8k" and bucket_of(99_999) == "64k-100k" and bucket_of(100_000) == ">=100k"
    )
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def test_tiers_shape(results: tuple[dict[str, Any], Path]) -> None:
    tiers = results[0]["tiers"]
    same, many = tiers["same_process"], tiers["many_processes"]
    assert all(same[m]["n"] >= 1 for m in ("ws", "http_prev", "http_prev_lean"))
    assert all(many[t]["n"] == 1 for t in ("connection", "hot", "snapshot", "full"))
    # each tier was really taken: A's HTTP fork hot, B's reconnect from the snapshot, C in full
    assert many["resolved"]["a"] == {"resolved_hot_total{transport=http}": 1.0}
    assert many["resolved"]["b"] == {"resolved_snapshot_total{transport=websocket}": 1.0}
    assert many["resolved"]["c"] == {"resolved_store_total{transport=websocket}": 1.0}
    assert same["resolved"]["resolved_hot_total{transport=http}"] >= 2
    assert "http_prev_over_ws_at_target" in tiers["summary"]


def test_baseline_tree_side_by_side(tmp_path: Path) -> None:
    """``--baseline-tree``: this tree against itself, interleaved; figures for both and their ratio."""
    tree = str(ROOT)
    code = suite_main(["--out", str(tmp_path), "--baseline-tree", tree, *TINY])
    assert code == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert {"overhead", "rollout"} <= data.keys() and "scale" not in data  # the compared ones only
    assert data["meta"]["trees"]["baseline"]["dir"] == tree
    for name in ("overhead", "rollout"):
        section = data[name]
        assert section["servers"]["baseline"]["responses_cache"].startswith(tree)
        assert "summary" in section["baseline"]
    overhead = data["overhead"]
    assert {s["tree"] for s in overhead["samples"]} == {"current"}
    assert {s["tree"] for s in overhead["baseline"]["samples"]} == {"baseline"}
    rows = overhead["comparison"]["rows"]
    assert {r["mode"] for r in rows if r["bucket"] == "all"} == {"http_full", "http_prev", "ws"}
    assert all(r["first_ratio"] > 0 and r["first_ratio_paired"]["n"] == r["n"] for r in rows)
    assert overhead["comparison"]["same_history"]
    rollout = data["rollout"]["comparison"]
    assert rollout["same_prompts"]
    assert all(len(rollout[m]["wall_s"]["per_repeat"]) == 1 for m in ("http_full", "http_prev", "ws"))


def test_baseline_tree_refused(tmp_path: Path) -> None:
    """Not a checkout, or a scenario it does not compare: refused before any server starts."""
    assert suite_main(["--out", str(tmp_path), "--baseline-tree", str(tmp_path)]) == 2
    args = ["--out", str(tmp_path), "--baseline-tree", str(ROOT), "--scenarios", "overhead,scale"]
    assert suite_main(args) == 2


def test_lanes_keep_the_single_tree_order() -> None:
    """One tree: the lanes are the modes, rotated per round as before; two: a mode's trees adjacent."""
    assert [m for _, m in rotated(lanes(("current",), MODES), 1)] == ["http_prev", "ws", "http_full"]
    assert rotated(lanes(("current", "baseline"), ("ws",)), 1) == [("baseline", "ws"), ("current", "ws")]


_FAKE_RUNNER = """
import dataclasses, json, sys
from pathlib import Path

@dataclasses.dataclass
class ServerSpec:
    instant: bool = True

def main(argv):
    Path(__file__).with_name("received.json").write_text(argv[0])
    print("PORT 1", flush=True)
    return 0
"""


def test_spec_fits_an_older_tree(tmp_path: Path) -> None:
    """A tree whose ServerSpec lacks fields gets the spec without them while they hold this tree's
    defaults, and refuses it when one is set; the child reports which files it imported."""
    (tmp_path / "responses_cache").mkdir()
    (tmp_path / "responses_cache" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "suite").mkdir(parents=True)
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "suite" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "suite" / "runner.py").write_text(_FAKE_RUNNER)
    server = ServerProcess(ServerSpec(instant=False), tree=tmp_path, startup_timeout=0.5)
    with pytest.raises(RuntimeError, match="did not become ready"):
        server.start()  # the fake runner prints a port and exits
    assert json.loads((tmp_path / "benchmarks" / "suite" / "received.json").read_text()) == {"instant": False}
    assert server.origin["responses_cache"] == str(tmp_path.resolve() / "responses_cache" / "__init__.py")
    with pytest.raises(RuntimeError, match="printed ''"):
        ServerProcess(ServerSpec(renderer="chatml"), tree=tmp_path).start()
