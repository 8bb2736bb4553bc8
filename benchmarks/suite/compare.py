"""Two source trees side by side (``--baseline-tree``): the lanes that interleave them, and the
ratios current / baseline with their spread.

A side-by-side run drives every mode against two servers, this checkout's (``current``) and the
baseline tree's (``baseline``, e.g. the previous commit), as the lanes of one rotation: turn by
turn in the overhead scenario, rollout by rollout in the rollout scenario, the order rotating so
that neither tree always goes first. Machine noise then hits both alike, and the figure to read is
the ratio current / baseline (about 1.0 where the two trees perform alike). Its spread comes from
pairs: each current turn with the baseline's same turn of the same conversation, each current
rollout with the baseline's of the same repeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from .agent import MODES, Mode
from .stats import BUCKETS, bucket_of, p50, percentile, ratio

T = TypeVar("T")

#: The row over every history bucket together.
ALL = "all"


def lanes(trees: Sequence[str], modes: Sequence[Mode]) -> list[tuple[str, Mode]]:
    """Every (tree, mode), a mode's trees next to each other (one tree: the modes in order)."""
    return [(tree, mode) for mode in modes for tree in trees]


def rotated(items: Sequence[T], k: int) -> list[T]:
    """``items`` rotated left by ``k`` (the order of round ``k``)."""
    k %= len(items)
    return [*items[k:], *items[:k]]


def spread(ratios: Sequence[float]) -> dict[str, float]:
    """p50 and interquartile range of paired ratios."""
    return {
        "n": len(ratios),
        "p25": percentile(ratios, 25),
        "p50": p50(ratios),
        "p75": percentile(ratios, 75),
    }


def overhead(current: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, Any]:
    """Per history bucket (and over all turns) and mode: each tree's p50 time to the first event
    and to completion, their ratio current / baseline, and the spread of the per-turn ratios."""
    base = {(s["mode"], s["repeat"], s["turn"]): s for s in baseline}
    pairs = [(s, base[(s["mode"], s["repeat"], s["turn"])]) for s in current]
    rows: list[dict[str, Any]] = []
    for label in [*(name for _, name in BUCKETS), ALL]:
        for mode in MODES:
            mine = [
                (c, b)
                for c, b in pairs
                if c["mode"] == mode and label in (ALL, bucket_of(c["history_tokens"]))
            ]
            if not mine:
                continue
            row: dict[str, Any] = {"bucket": label, "mode": mode, "n": len(mine)}
            for key, name in (("first_event_ms", "first"), ("completed_ms", "completed")):
                cur = p50([c[key] for c, _ in mine])
                was = p50([b[key] for _, b in mine])
                row[f"baseline_{name}_p50_ms"] = was
                row[f"current_{name}_p50_ms"] = cur
                row[f"{name}_ratio"] = ratio(cur, was)
                row[f"{name}_ratio_paired"] = spread([ratio(c[key], b[key]) for c, b in mine])
            rows.append(row)
    return {
        "rows": rows,
        # Same prompt tokens turn for turn: both trees rendered the conversation alike.
        "same_history": all(c["history_tokens"] == b["history_tokens"] for c, b in pairs),
    }


def rollout(current: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: each tree's p50 wall time, time over the engine's floor per turn and first event,
    their ratio current / baseline, and the ratios of the rollouts of the same repeat."""
    base = {(r["mode"], r["repeat"]): r for r in baseline}
    out: dict[str, Any] = {}
    for mode in MODES:
        mine = [(c, base[(mode, c["repeat"])]) for c in current if c["mode"] == mode]
        if not mine:
            continue
        row: dict[str, Any] = {"n": len(mine)}
        for key in ("wall_s", "per_turn_overhead_ms", "first_event_p50_ms"):
            cur = p50([c[key] for c, _ in mine])
            was = p50([b[key] for _, b in mine])
            row[key] = {
                "baseline_p50": was,
                "current_p50": cur,
                "ratio": ratio(cur, was),
                "per_repeat": [ratio(c[key], b[key]) for c, b in mine],
            }
        out[mode] = row
    # Context fidelity across the trees: the engine saw prompts of the same length.
    out["same_prompts"] = {r["final_input_tokens"] for r in current} == {
        r["final_input_tokens"] for r in baseline
    }
    return out
