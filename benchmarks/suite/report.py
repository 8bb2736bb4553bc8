"""Results out: terminal tables, the JSON file, the overhead plot, and the target checks."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .agent import MODES
from .compare import ALL

#: The issue's targets.
WS_P50_MS = 1.0
FULL_OVER_WS_AT_100K = 50.0
ROLLOUT_OVER_FLOOR = 0.05
SCALE_BYTES_PER_TOKEN = 6.0
HTTP_PREV_OVER_WS = 1.5

_BIN_TOKENS = 8_000  # plot: one median point per 8k tokens of history


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target: what it asks, what was measured, and whether it is met."""
    out: list[dict[str, Any]] = []
    overhead = results.get("overhead")
    if overhead:
        s = overhead["summary"]
        out.append(
            _target(
                "WS overhead p50 <= 1 ms at every history length",
                s["ws_first_p50_max_ms"],
                "ms",
                s["ws_first_p50_max_ms"] <= WS_P50_MS,
            )
        )
        ratio = s["full_over_ws_at_100k"]
        out.append(
            _target(
                "HTTP full resend / WS >= 50x at 100k tokens",
                ratio,
                "x",
                not math.isnan(ratio) and ratio >= FULL_OVER_WS_AT_100K,
            )
        )
    rollout = results.get("rollout")
    if rollout and "ws" in rollout["summary"]:
        over = rollout["summary"]["ws"]["over_floor_p50"]
        out.append(
            _target(
                "Agent rollout over WS within 5% of the floor",
                over * 100,
                "%",
                over <= ROLLOUT_OVER_FLOOR,
            )
        )
    tiers = results.get("tiers")
    if tiers:
        r = tiers["summary"]["http_prev_over_ws_at_target"]
        out.append(
            _target(
                "HTTP previous_response_id / WS <= 1.5x at 100k tokens (same process, lean client)",
                r,
                "x",
                not math.isnan(r) and r <= HTTP_PREV_OVER_WS,
            )
        )
    scale = results.get("scale")
    if scale:
        out.append(
            _target(
                f"{scale['connections']} connections: 0 errors",
                scale["errors"],
                "errors",
                scale["errors"] == 0,
            )
        )
        # The cache's own memory: every object the cached states hold (token logs, items,
        # Response objects), walked in the server. The RSS delta also counts what is not cache:
        # allocator slack, freed request frames glibc keeps, per-connection socket buffers.
        bpt = scale["object_bytes_per_token"]
        out.append(
            _target(
                "Cache memory <= 6 bytes/token (cached objects)",
                bpt,
                "B/token",
                bpt <= SCALE_BYTES_PER_TOKEN,
            )
        )
        out.append(_target("Process RSS growth per cached token (context)", scale["rss_bytes_per_token"], "B/token", None))
    return out


def _target(name: str, value: float, unit: str, met: bool | None) -> dict[str, Any]:
    """One row of the targets table; ``met=None`` for a figure reported for context only."""
    return {"target": name, "measured": value, "unit": unit, "met": None if met is None else bool(met)}


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([line, sep, *body])


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def render_text(results: dict[str, Any]) -> str:
    parts: list[str] = _trees_section(results)
    for key, section in (
        ("overhead", _overhead_section),
        ("rollout", _rollout_section),
        ("scale", _scale_section),
        ("tiers", _tiers_section),
        ("targets", _targets_section),
    ):
        if results.get(key):
            parts.extend(section(results[key]))
    return "\n".join(parts)


def _trees_section(results: dict[str, Any]) -> list[str]:
    """The two trees of a side-by-side run, and the files each server imported its code from."""
    trees = results.get("meta", {}).get("trees")
    if not trees:
        return []
    origins: dict[str, dict[str, str]] = next(
        (results[k]["servers"] for k in ("overhead", "rollout") if k in results), {}
    )
    parts = ["Side by side: this tree (current) against --baseline-tree (baseline)"]
    for name, tree in trees.items():
        changed = " + uncommitted changes" if tree.get("modified") else ""
        parts.append(f"  {name}: {tree['dir']} at {tree.get('commit')}{changed}")
        if name in origins:
            parts.append(f"    server imported responses_cache from {origins[name]['responses_cache']}")
    return [*parts, ""]


def _overhead_section(overhead: dict[str, Any]) -> list[str]:
    """Time to first event and to completion by history size, per transport."""
    parts: list[str] = []
    rows = [
        [
            b["bucket"],
            b["ws_n"],
            b["http_full_first_p50_ms"],
            b["http_prev_first_p50_ms"],
            b["ws_first_p50_ms"],
            b["full_over_ws"],
            b["prev_over_ws"],
            b["http_full_completed_p50_ms"],
            b["ws_completed_p50_ms"],
        ]
        for b in overhead["summary"]["buckets"]
    ]
    parts.append(
        "Overhead vs history (zero-latency engine; p50 ms to first event / to response.completed)"
    )
    parts.append(
        table(
            [
                "history",
                "n",
                "http_full",
                "http_prev",
                "ws",
                "full/ws",
                "prev/ws",
                "full done",
                "ws done",
            ],
            rows,
        )
    )
    for transport, stages in overhead.get("server_stages_ms", {}).items():
        parts.append(
            f"  server stages, {transport} (mean ms): "
            + ", ".join(f"{k} {v:.3f}" for k, v in stages.items())
        )
    if "comparison" in overhead:
        parts.extend(_overhead_comparison(overhead["comparison"]))
    return parts


def _iqr(spread: dict[str, float]) -> str:
    return f"{_cell(spread['p50'])} [{_cell(spread['p25'])}-{_cell(spread['p75'])}]"


def _overhead_comparison(comparison: dict[str, Any]) -> list[str]:
    """Current against baseline, per mode, at the longest history reached and over all turns."""
    rows = comparison["rows"]
    top = next((r["bucket"] for r in reversed(rows) if r["bucket"] != ALL), None)
    parts = [
        "\nOverhead, current vs baseline (p50 ms; cur/base: ratio of the p50s; paired: per-turn "
        "ratios, p50 [p25-p75])"
    ]
    parts.append(
        table(
            ["history", "mode", "n", "base first", "cur first", "cur/base", "paired",
             "base done", "cur done", "done cur/base"],
            [
                [
                    r["bucket"], r["mode"], r["n"],
                    r["baseline_first_p50_ms"], r["current_first_p50_ms"], r["first_ratio"],
                    _iqr(r["first_ratio_paired"]),
                    r["baseline_completed_p50_ms"], r["current_completed_p50_ms"],
                    r["completed_ratio"],
                ]
                for r in rows
                if r["bucket"] in (top, ALL)
            ],
        )
    )
    parts.append(
        "  same prompt tokens turn for turn in both trees: "
        + ("yes" if comparison["same_history"] else "NO")
    )
    return parts


def _rollout_section(rollout: dict[str, Any]) -> list[str]:
    """An agent rollout's wall time per mode, against the engine's floor."""
    parts: list[str] = []
    s = rollout["summary"]
    o = rollout["options"]
    parts.append(
        f"\nAgent rollout ({o['tool_calls']} tool calls, {o['tool_output_tokens']} tokens/tool output, "
        f"{o['tool_ms']:g} ms/tool, {o['output_tokens_per_s']:g} tok/s out, {o['prefill_tokens_per_s']:g} tok/s prefill; p50 of {o['repeats']})"
    )
    rows = [
        [
            m,
            s[m]["wall_s_p50"],
            s[m]["floor_s_p50"],
            s[m]["over_floor_p50"] * 100,
            s[m]["per_turn_overhead_ms_p50"],
            s[m]["first_event_p50_ms"],
        ]
        for m in MODES
        if m in s
    ]
    parts.append(
        table(
            [
                "mode",
                "wall s",
                "floor s",
                "over floor %",
                "ms/turn over floor",
                "first event ms",
            ],
            rows,
        )
    )
    speedup = s.get("ws_speedup_vs_http_full")
    if speedup is not None:
        parts.append(
            f"  WebSocket rollout is {speedup * 100:.1f}% faster than HTTP full resend end to end"
        )
    parts.append(
        f"  same prompt tokens in every mode (context fidelity): {'yes' if s.get('prompts_match') else 'NO'}"
    )
    if "comparison" in rollout:
        parts.extend(_rollout_comparison(rollout["comparison"]))
    return parts


def _rollout_comparison(comparison: dict[str, Any]) -> list[str]:
    """Current against baseline, per mode: wall time, time over the floor, first event."""
    parts = [
        "\nAgent rollout, current vs baseline (p50; cur/base: ratio of the p50s; per repeat: the "
        "ratio of each repeat's two rollouts)"
    ]
    rows = []
    for mode in MODES:
        if mode not in comparison:
            continue
        wall, over, first = (
            comparison[mode][k] for k in ("wall_s", "per_turn_overhead_ms", "first_event_p50_ms")
        )
        rows.append(
            [
                mode, wall["baseline_p50"], wall["current_p50"], wall["ratio"],
                " ".join(_cell(x) for x in wall["per_repeat"]),
                over["baseline_p50"], over["current_p50"], over["ratio"],
                first["baseline_p50"], first["current_p50"], first["ratio"],
            ]
        )  # fmt: skip
    parts.append(
        table(
            ["mode", "base wall s", "cur wall s", "cur/base", "per repeat",
             "base ms/turn over floor", "cur", "cur/base",
             "base first event ms", "cur", "cur/base"],
            rows,
        )
    )
    parts.append(
        "  same prompt tokens in both trees: " + ("yes" if comparison["same_prompts"] else "NO")
    )
    return parts


def _scale_section(scale: dict[str, Any]) -> list[str]:
    """Many connections with long histories: throughput, latency and bytes per cached token."""
    parts: list[str] = []
    o = scale["options"]
    fp = scale["after_build"]["footprint"]["bytes"]
    tokens = max(scale["cached_tokens"], 1)
    steady = scale["after_turns"]
    parts.append(
        f"\nScale ({o['connections']} WebSocket connections x {o['context_tokens']} tokens, {o['turns']} turns each)"
    )
    parts.append(
        table(
            [
                "conns",
                "errors",
                "build s",
                "turns/s",
                "turn p50 ms",
                "turn p99 ms",
                "cached tokens",
                "RSS B/tok",
                "objects B/tok",
            ],
            [
                [
                    scale["connections"],
                    scale["errors"],
                    scale["build_s"],
                    scale["turns_per_s"],
                    scale["turn_p50_ms"],
                    scale["turn_p99_ms"],
                    scale["cached_tokens"],
                    scale["rss_bytes_per_token"],
                    scale["object_bytes_per_token"],
                ]
            ],
        )
    )
    parts.append(
        "  cache objects by kind after build (B/token): "
        + ", ".join(f"{k} {v / tokens:.2f}" for k, v in fp.items())
    )
    parts.append(
        f"  after the turns: RSS {steady['rss_bytes_per_token']:.2f} B/token, objects "
        f"{steady['object_bytes_per_token']:.2f} B/token ({steady['cached_tokens']} tokens)"
    )
    for label, key in (("after build", "after_build"), ("after turns", "after_turns")):
        sites = scale[key].get("tracemalloc")
        if sites:
            parts.append(f"  top allocation sites since the mark, {label}:")
            parts.extend(
                f"    {s['bytes'] / tokens:7.2f} B/token  {s['count']:>7}  {s['site']}"
                for s in sites[:8]
            )
    return parts


def _tiers_section(tiers: dict[str, Any]) -> list[str]:
    """Time to first event by where a turn's parent state was found."""
    parts: list[str] = []
    same, many = tiers["same_process"], tiers["many_processes"]
    parts.append(
        f"\nState tiers (one process: history >= {tiers['options']['target_tokens']} tokens; "
        f"many processes over one Redis: {many['history_tokens']} tokens)"
    )
    parts.append(
        table(
            ["where the state is", "n", "first p50 ms", "first p90 ms", "completed p50 ms"],
            [
                [label, row["n"], row["first_p50_ms"], row["first_p90_ms"], row["completed_p50_ms"]]
                for label, row in (
                    ("one process: WebSocket", same["ws"]),
                    ("one process: HTTP previous_response_id (lean client)", same["http_prev_lean"]),
                    ("one process: HTTP previous_response_id (httpx)", same["http_prev"]),
                    ("Redis: same connection", many["connection"]),
                    ("Redis: hot cache (HTTP, same process)", many["hot"]),
                    ("Redis: other process, snapshot", many["snapshot"]),
                    ("Redis: other process, full render", many["full"]),
                )
            ],
        )
    )
    parts.append(
        f"  HTTP previous_response_id / WebSocket: {same['http_prev_lean_over_ws']:.2f}x to the first event, "
        f"{same['http_prev_lean_over_ws_completed']:.2f}x to completed (httpx client: "
        f"{same['http_prev_over_ws']:.2f}x, {same['http_prev_over_ws_completed']:.2f}x); "
        f"full render / snapshot after a reconnect: {many['full_over_snapshot']:.2f}x"
    )
    return parts


def _targets_section(checks: list[dict[str, Any]]) -> list[str]:
    """Each target, what was measured, and whether it was met."""
    parts: list[str] = []
    parts.append("\nTargets")
    parts.append(
        table(
            ["target", "measured", "unit", "met"],
            [[t["target"], t["measured"], t["unit"], t["met"]] for t in checks],
        )
    )
    return parts


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, default=_json_default, allow_nan=True) + "\n")


def _json_default(value: object) -> object:
    return str(value)


def plot_overhead(overhead: dict[str, Any], path: Path) -> None:
    """Per-turn time to first event against history length, per mode (log scale), with p50 lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"http_full": "tab:red", "http_prev": "tab:orange", "ws": "tab:blue"}
    labels = {
        "http_full": "HTTP, full resend",
        "http_prev": "HTTP, previous_response_id",
        "ws": "WebSocket mode",
    }
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    samples = overhead["samples"]
    for mode in MODES:
        mine = [s for s in samples if s["mode"] == mode]
        if not mine:
            continue
        ax.scatter(
            [s["history_tokens"] / 1000 for s in mine],
            [s["first_event_ms"] for s in mine],
            s=6,
            alpha=0.35,
            color=colors[mode],
        )
        bins: dict[int, list[float]] = {}
        for s in mine:
            bins.setdefault(s["history_tokens"] // _BIN_TOKENS, []).append(s["first_event_ms"])
        xs = [(b + 0.5) * _BIN_TOKENS / 1000 for b in sorted(bins)]
        ys = [sorted(bins[b])[len(bins[b]) // 2] for b in sorted(bins)]
        ax.plot(
            xs,
            ys,
            color=colors[mode],
            label=labels[mode] + " (median per 8k)",
            linewidth=2,
            marker="o",
            markersize=3,
        )
    ax.axhline(WS_P50_MS, color="gray", linestyle="--", linewidth=1, label="1 ms target")
    ax.set_yscale("log")
    ax.set_xlabel("conversation history (k tokens)")
    ax.set_ylabel("time to first event (ms, log)")
    ax.set_title("Per-turn API overhead vs history (zero-latency engine)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
