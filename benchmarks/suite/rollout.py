"""Agent rollout: a scripted coding-agent task (``tool_calls`` calls, then an answer) end to end,
on an engine with realistic timing, per transport mode, against the engine's own floor.

The floor is what the engine alone needs, from its own timing model: per turn, prefill of the
prompt tokens its prefix cache cannot supply (the cache keeps whole ``kv_block_tokens`` blocks of
the previous prompt) at ``prefill_tokens_per_s``, plus decode (``output_tokens /
output_tokens_per_s``), plus the tool time the client injects per call. Modes run one rollout each
in turn (rotating the order per repeat), each with its own first system-prompt line, so the
engine's content-addressed prefix cache never serves one run from another's prompts. With a
baseline tree, each mode runs against both trees' servers in the same rotation (:mod:`.compare`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from responses_cache.backends.simulated import SimulatedConfig

from . import compare
from .agent import MODES, AgentLoop, Mode
from .clients import TurnTiming
from .runner import ServerSpec
from .server import BASELINE, CURRENT, ServerProcess, servers
from .stats import p50
from .workload import code_text, prose_text, tool_output, tools, user_message

TASK = "Add input validation to the config loader, update its tests and make the suite pass."


@dataclass(frozen=True, slots=True)
class RolloutOptions:
    tool_calls: int = 30
    tool_output_tokens: int = 1_000
    tool_ms: float = 0.0
    instructions_tokens: int = 1_500
    output_tokens_per_s: float = 1_000.0
    prefill_tokens_per_s: float = 20_000.0
    argument_tokens: int = 40
    answer_tokens: int = 200
    repeats: int = 3
    renderer: str | None = "harmony"
    profile_dir: str | None = None
    #: Another checkout to measure side by side with this one (``--baseline-tree``).
    baseline_tree: str | None = None


def spec_for(opts: RolloutOptions) -> ServerSpec:
    keys = {f"sk-{m}-{r}": f"tenant-{m}-{r}" for m in MODES for r in range(-1, opts.repeats + 1)}
    return ServerSpec(
        instant=False,
        output_tokens_per_s=opts.output_tokens_per_s,
        prefill_tokens_per_s=opts.prefill_tokens_per_s,
        scenario={
            "tool_calls": opts.tool_calls,
            "argument_tokens": opts.argument_tokens,
            "answer_tokens": opts.answer_tokens,
        },
        renderer=opts.renderer,
        api_keys=keys,
        context_window=1 << 22,
    )


def turns_per_rollout(opts: RolloutOptions) -> int:
    return opts.tool_calls + 1


def run(opts: RolloutOptions, tick: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with servers(spec_for(opts), opts.baseline_tree) as by_tree:
        outputs = [code_text(opts.tool_output_tokens, seed=500 + i) for i in range(opts.tool_calls)]
        for server in by_tree.values():  # warm-up: imports, tokenizer caches
            _rollout(server, opts, "ws", -1, outputs[:2], calls=2)
        lanes = compare.lanes(tuple(by_tree), MODES)
        for rep in range(opts.repeats):
            for tree, mode in compare.rotated(lanes, rep):
                result = _rollout(by_tree[tree], opts, mode, rep, outputs, tick=tick)
                runs.append({"tree": tree, **result})
        origins = {tree: server.origin for tree, server in by_tree.items()}
        server = by_tree[CURRENT]
        if opts.profile_dir:
            server.post("/_bench/profile/start")
            _rollout(server, opts, "ws", opts.repeats, outputs)
            path = Path(opts.profile_dir) / "profile-rollout-ws"
            path.with_suffix(".txt").write_text(
                server.post(f"/_bench/profile/stop?path={path}.prof&top=30")["text"]
            )
    current = [r for r in runs if r["tree"] == CURRENT]
    out: dict[str, Any] = {
        "options": asdict(opts),
        "runs": current,
        "summary": summarize(current),
        "servers": origins,
    }
    if opts.baseline_tree is not None:
        baseline = [r for r in runs if r["tree"] == BASELINE]
        out["baseline"] = {"runs": baseline, "summary": summarize(baseline)}
        out["comparison"] = compare.rollout(current, baseline)
    return out


def _rollout(
    server: ServerProcess,
    opts: RolloutOptions,
    mode: Mode,
    rep: int,
    outputs: list[str],
    *,
    calls: int | None = None,
    tick: Callable[[int], None] = lambda n: None,
) -> dict[str, Any]:
    # A different first line per run (same length in tokens, so prompts stay comparable across
    # modes): the engine's prefix cache is content-addressed.
    session = 1000 + 100 * MODES.index(mode) + rep + 1
    instructions = f"Session {session}.\n" + prose_text(opts.instructions_tokens, seed=11)
    loop = AgentLoop(
        mode,
        http_url=server.http_url,
        ws_url=server.ws_url,
        api_key=f"sk-{mode}-{rep}",
        instructions=instructions,
        tools=tools(),
    )
    results: list[TurnTiming] = []
    tool_s = opts.tool_ms / 1e3
    limit = opts.tool_calls if calls is None else calls
    try:
        items = [user_message(TASK)]
        start = time.perf_counter()
        while True:
            result = loop.send(items)
            results.append(result)
            tick(1)
            call_id = result.call_id()
            if call_id is None or len(results) > limit:
                break
            if tool_s:
                time.sleep(tool_s)
            items = [tool_output(call_id, outputs[(len(results) - 1) % len(outputs)])]
        wall = time.perf_counter() - start
    finally:
        loop.close()
    calls_made = sum(1 for r in results if r.call_id() is not None)
    engine_s = engine_floor(results, opts)
    floor = engine_s + calls_made * tool_s
    return {
        "mode": mode,
        "repeat": rep,
        "turns": len(results),
        "tool_calls": calls_made,
        "wall_s": wall,
        "engine_s": engine_s,
        "floor_s": floor,
        "over_floor": wall / floor - 1 if floor > 0 else float("nan"),
        "per_turn_overhead_ms": (wall - floor) / len(results) * 1e3,
        "first_event_p50_ms": p50([r.first_event_s * 1e3 for r in results]),
        "final_input_tokens": results[-1].input_tokens,
    }


def engine_floor(results: list[TurnTiming], opts: RolloutOptions) -> float:
    """Engine time alone, from its timing model: prefill of what its prefix cache cannot supply
    (whole blocks of the previous prompt are cached), plus decode."""
    block = SimulatedConfig().kv_block_tokens
    total = 0.0
    previous = 0
    for r in results:
        cached = min(previous // block * block, r.input_tokens)
        total += (r.input_tokens - cached) / opts.prefill_tokens_per_s
        total += r.output_tokens / opts.output_tokens_per_s
        previous = r.input_tokens
    return total


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue
        out[mode] = {
            "wall_s_p50": p50([r["wall_s"] for r in mine]),
            "floor_s_p50": p50([r["floor_s"] for r in mine]),
            "over_floor_p50": p50([r["over_floor"] for r in mine]),
            "per_turn_overhead_ms_p50": p50([r["per_turn_overhead_ms"] for r in mine]),
            "first_event_p50_ms": p50([r["first_event_p50_ms"] for r in mine]),
            "final_input_tokens": mine[-1]["final_input_tokens"],
        }
    # Context fidelity, end to end: every mode must have sent the engine the same prompt.
    out["prompts_match"] = len({r["final_input_tokens"] for r in runs}) == 1
    if "ws" in out and "http_full" in out:
        out["ws_speedup_vs_http_full"] = (
            out["http_full"]["wall_s_p50"] / out["ws"]["wall_s_p50"] - 1
        )
    return out
