"""Overhead vs history: per-turn API overhead as an agent conversation grows past 100k tokens.

A zero-latency engine (``instant=True``) calls a tool on every turn; the client answers each call
with about ``tokens_per_turn`` tokens of code-like output. The three modes of :mod:`.agent` run
the same conversation, interleaved turn by turn (rotating which mode goes first), so machine noise
hits them alike (with a baseline tree, each mode runs against both trees' servers in one rotation:
see :mod:`.compare`). Measured per turn: time to the first event (``response.created``, i.e. all the
work before generation) and to ``response.completed``.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import compare
from .agent import MODES, AgentLoop, Mode
from .runner import ServerSpec
from .server import BASELINE, CURRENT, ServerProcess, servers
from .stats import BUCKETS, bucket_of, p50, percentile, ratio
from .workload import code_text, prose_text, tool_output, tools, user_message

TASK = "The test suite fails in src/parser: find the cause, fix it and run the tests again."


@dataclass(frozen=True, slots=True)
class OverheadOptions:
    target_tokens: int = 120_000
    tokens_per_turn: int = 2_000
    repeats: int = 5
    warmup_turns: int = 3
    instructions_tokens: int = 1_500
    #: Idle time before each measured turn, so a turn never overlaps the previous one's tail
    #: (connection teardown, store writes) on the server; agents run tools between turns anyway.
    pause_ms: float = 5.0
    renderer: str | None = "harmony"
    profile_dir: str | None = None
    #: Another checkout to measure side by side with this one (``--baseline-tree``).
    baseline_tree: str | None = None


def spec_for(opts: OverheadOptions) -> ServerSpec:
    # Zero latency, but not ``instant=True``: an instant engine never suspends, so the turn task
    # runs to the end before the writer flushes ``response.created`` and the first event would
    # include the whole generation. Rates of 1e12 tokens/s make the engine yield once (prefill,
    # ``asyncio.sleep(~0)``) and cost nothing else, as a real engine's first await would.
    return ServerSpec(
        instant=False,
        prefill_tokens_per_s=1e12,
        output_tokens_per_s=1e12,
        scenario={"tool_calls": 1_000_000, "argument_tokens": 40, "answer_tokens": 24},
        renderer=opts.renderer,
        api_keys={f"sk-{m}": f"tenant-{m}" for m in MODES},
        context_window=1 << 22,
    )


def estimated_turns(opts: OverheadOptions) -> int:
    return math.ceil((opts.target_tokens - opts.instructions_tokens) / opts.tokens_per_turn) + 1


def run(opts: OverheadOptions, tick: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
    samples: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    origins: dict[str, dict[str, str]] = {}
    gc.disable()  # no client-side collections inside a timed turn; collected between conversations
    try:
        with servers(spec_for(opts), opts.baseline_tree) as by_tree:
            origins = {tree: server.origin for tree, server in by_tree.items()}
            _measure(by_tree, opts, samples, stages, profiles, tick)
    finally:
        gc.enable()
    current = [s for s in samples if s["tree"] == CURRENT]
    out: dict[str, Any] = {
        "options": asdict(opts),
        "samples": current,
        "summary": summarize(current),
        "server_stages_ms": stages.get(CURRENT, {}),
        "profiles": profiles,
        "servers": origins,
    }
    if opts.baseline_tree is not None:
        baseline = [s for s in samples if s["tree"] == BASELINE]
        out["baseline"] = {
            "samples": baseline,
            "summary": summarize(baseline),
            "server_stages_ms": stages.get(BASELINE, {}),
        }
        out["comparison"] = compare.overhead(current, baseline)
    return out


def _measure(
    by_tree: Mapping[str, ServerProcess],
    opts: OverheadOptions,
    samples: list[dict[str, Any]],
    stages: dict[str, Any],
    profiles: dict[str, Any],
    tick: Callable[[int], None],
) -> None:
    _conversation(by_tree, opts, rep=-1, modes=MODES, turns=opts.warmup_turns)
    before = {tree: server.get("/_bench/stats")["summaries"] for tree, server in by_tree.items()}
    for rep in range(opts.repeats):
        gc.collect()
        samples += _conversation(by_tree, opts, rep=rep, modes=MODES, tick=tick)
    for tree, server in by_tree.items():
        stages[tree] = stage_means(before[tree], server.get("/_bench/stats")["summaries"])
    if opts.profile_dir:
        server = by_tree[CURRENT]
        for mode in MODES:
            server.post("/_bench/profile/start")
            _conversation({CURRENT: server}, opts, rep=1000, modes=(mode,))
            path = Path(opts.profile_dir) / f"profile-overhead-{mode}"
            text = server.post(f"/_bench/profile/stop?path={path}.prof&top=30")["text"]
            path.with_suffix(".txt").write_text(text)
            profiles[mode] = str(path.with_suffix(".txt"))


def _conversation(
    by_tree: Mapping[str, ServerProcess],
    opts: OverheadOptions,
    *,
    rep: int,
    modes: tuple[Mode, ...],
    turns: int | None = None,
    tick: Callable[[int], None] = lambda n: None,
) -> list[dict[str, Any]]:
    """One conversation per mode and server (a lane), the lanes interleaved turn by turn."""
    instructions = prose_text(opts.instructions_tokens, seed=7 + rep)
    lanes = compare.lanes(tuple(by_tree), modes)
    loops = {
        (tree, m): AgentLoop(
            m,
            http_url=by_tree[tree].http_url,
            ws_url=by_tree[tree].ws_url,
            api_key=f"sk-{m}",
            instructions=instructions,
            tools=tools(),
        )
        for tree, m in lanes
    }
    samples: list[dict[str, Any]] = []
    call_ids: dict[tuple[str, Mode], str | None] = dict.fromkeys(lanes)
    try:
        turn = 0
        while True:
            text = code_text(opts.tokens_per_turn, seed=rep * 100_000 + turn)
            for lane in compare.rotated(lanes, turn):
                tree, mode = lane
                loop = loops[lane]
                call_id = call_ids[lane]
                items = [user_message(TASK)] if call_id is None else [tool_output(call_id, text)]
                wire = loop.encode(items)
                time.sleep(opts.pause_ms / 1e3)
                result = loop.send(items, wire)
                call_ids[lane] = result.call_id()
                samples.append(
                    {
                        "tree": tree,
                        "mode": mode,
                        "repeat": rep,
                        "turn": turn,
                        "history_tokens": loop.history_tokens - result.output_tokens,
                        "first_event_ms": result.first_event_s * 1e3,
                        "completed_ms": result.completed_s * 1e3,
                        "cached_tokens": int(
                            (result.response.get("usage") or {})
                            .get("input_tokens_details", {})
                            .get("cached_tokens", 0)
                        ),
                    }
                )
                tick(1)
            turn += 1
            if turns is not None and turn >= turns:
                break
            if (
                turns is None
                and min(lp.history_tokens for lp in loops.values()) >= opts.target_tokens
            ):
                break
    finally:
        for lp in loops.values():
            lp.close()
    return samples


def stage_means(
    before: dict[str, list[float]], after: dict[str, list[float]]
) -> dict[str, dict[str, float]]:
    """Mean server time per pipeline stage and transport (ms) between two metric snapshots."""
    out: dict[str, dict[str, float]] = {}
    for key, (count, total) in after.items():
        if not key.startswith("stage_seconds{"):
            continue
        labels = dict(part.split("=", 1) for part in key[len("stage_seconds{") : -1].split(","))
        n = count - before.get(key, [0.0, 0.0])[0]
        if n > 0:
            seconds = total - before.get(key, [0.0, 0.0])[1]
            out.setdefault(labels["transport"], {})[labels["stage"]] = seconds / n * 1e3
    return out


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """p50 per mode and history bucket, and the HTTP/WS ratios."""
    rows: list[dict[str, Any]] = []
    for _, label in BUCKETS:
        row: dict[str, Any] = {"bucket": label}
        for mode in MODES:
            picked = [
                s for s in samples if s["mode"] == mode and bucket_of(s["history_tokens"]) == label
            ]
            row[f"{mode}_n"] = len(picked)
            row[f"{mode}_first_p50_ms"] = p50([s["first_event_ms"] for s in picked])
            row[f"{mode}_first_p90_ms"] = percentile([s["first_event_ms"] for s in picked], 90)
            row[f"{mode}_completed_p50_ms"] = p50([s["completed_ms"] for s in picked])
        row["full_over_ws"] = ratio(row["http_full_first_p50_ms"], row["ws_first_p50_ms"])
        row["prev_over_ws"] = ratio(row["http_prev_first_p50_ms"], row["ws_first_p50_ms"])
        row["full_over_ws_completed"] = ratio(
            row["http_full_completed_p50_ms"], row["ws_completed_p50_ms"]
        )
        if row["ws_n"]:
            rows.append(row)
    ws_all = [r["ws_first_p50_ms"] for r in rows]
    top = next((r for r in rows if r["bucket"] == ">=100k"), None)
    return {
        "buckets": rows,
        "ws_first_p50_max_ms": max(ws_all) if ws_all else math.nan,
        "full_over_ws_at_100k": top["full_over_ws"] if top else math.nan,
        "max_history_tokens": max((s["history_tokens"] for s in samples), default=0),
    }
