"""``python -m benchmarks.suite``: the server's benchmarks over loopback (see ``docs/benchmarks.md``).

Three scenarios, each against a fresh server subprocess on the embedded simulated engine:

* ``overhead`` — per-turn API overhead vs history length, HTTP full resend vs HTTP
  ``previous_response_id`` vs WebSocket mode (:mod:`.overhead`);
* ``rollout`` — a 30-tool-call agent rollout end to end vs the engine's floor (:mod:`.rollout`);
* ``scale`` — 1,000 concurrent WebSocket connections with 16k-token contexts (:mod:`.scale`);
* ``tiers`` — at about 100k tokens: HTTP ``previous_response_id`` against WebSocket on one process,
  and a continuation on another process (shared Redis) from the token-log snapshot against a
  full render (:mod:`.tiers`; starts a private ``redis-server``).

Writes a table to the terminal and ``results.json`` plus ``overhead.png`` to ``--out``.

``--baseline-tree DIR`` (another checkout, e.g. ``git worktree add /tmp/base HEAD~1``) runs the
overhead and rollout scenarios against this tree's server and DIR's side by side, interleaved,
and reports each mode's figures for both and their ratio current / baseline (:mod:`.compare`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import overhead, rollout, scale, tiers
from .report import plot_overhead, render_text, targets, write_json
from .server import BASELINE, CURRENT, ROOT

SCENARIOS = ("overhead", "rollout", "scale", "tiers")
#: The scenarios ``--baseline-tree`` compares (and runs by default).
COMPARED = ("overhead", "rollout")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenarios",
        help=f"comma-separated subset of: {', '.join(SCENARIOS)} "
        f"(default: all; with --baseline-tree: {','.join(COMPARED)})",
    )
    p.add_argument(
        "--baseline-tree",
        metavar="DIR",
        help="another checkout of the repository (e.g. `git worktree add DIR HEAD~1`): run "
        + " and ".join(COMPARED)
        + " against its server and this tree's side by side, interleaved, and report the ratios",
    )
    p.add_argument(
        "--out", default="bench-results", help="output directory (default: bench-results)"
    )
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    p.add_argument(
        "--renderer", default="harmony", help="prompt renderer: harmony, chatml, or none"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile the server per scenario (extra runs; written to --out)",
    )
    g = p.add_argument_group("overhead")
    g.add_argument(
        "--target-tokens", type=int, help="grow each conversation to this many tokens (120000)"
    )
    g.add_argument("--tokens-per-turn", type=int, help="tool-output tokens added per turn (2000)")
    g.add_argument("--repeats", type=int, help="conversations per mode (5)")
    g = p.add_argument_group("rollout")
    g.add_argument("--tool-calls", type=int, help="tool calls per rollout (30)")
    g.add_argument("--tool-ms", type=float, help="simulated tool time per call, ms (0)")
    g.add_argument("--tool-output-tokens", type=int, help="tokens per tool output (1000)")
    g.add_argument("--output-tps", type=float, help="engine output tokens/s (1000)")
    g.add_argument("--prefill-tps", type=float, help="engine prefill tokens/s (20000)")
    g.add_argument("--rollout-repeats", type=int, help="rollouts per mode (3)")
    g = p.add_argument_group("scale")
    g.add_argument("--connections", type=int, help="concurrent WebSocket connections (1000)")
    g.add_argument("--context-tokens", type=int, help="tokens of context per connection (16000)")
    g.add_argument(
        "--scale-turns", type=int, help="turns per connection after the context is built (10)"
    )
    g.add_argument(
        "--tracemalloc",
        action="store_true",
        help="scale: report the server's top allocation sites (slower)",
    )
    g = p.add_argument_group("tiers")
    g.add_argument("--tiers-target-tokens", type=int, help="history at which the tiers are measured (100000)")
    g.add_argument("--tiers-samples", type=int, help="measured turns per mode and tier (10)")
    return p


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def resolve_renderer(name: str) -> tuple[str | None, str | None]:
    """The renderer to run with, and a note when it had to fall back to none."""
    if name.lower() in ("", "none"):
        return None, None
    try:
        from responses_cache.tokens import get_renderer

        get_renderer(name)
    except Exception as exc:
        return None, f"renderer {name!r} unavailable ({exc!r}); ran WITHOUT tokenization"
    return name, None


def options(
    args: argparse.Namespace, renderer: str | None, profile_dir: str | None
) -> dict[str, Any]:
    q = args.quick
    ov = overhead.OverheadOptions(
        target_tokens=_pick(args.target_tokens, 112_000 if q else 120_000),
        tokens_per_turn=_pick(args.tokens_per_turn, 2_000),
        repeats=_pick(args.repeats, 1 if q else 5),
        warmup_turns=2 if q else 3,
        renderer=renderer,
        profile_dir=profile_dir,
        baseline_tree=args.baseline_tree,
    )
    ro = rollout.RolloutOptions(
        tool_calls=_pick(args.tool_calls, 10 if q else 30),
        tool_ms=_pick(args.tool_ms, 0.0),
        tool_output_tokens=_pick(args.tool_output_tokens, 1_000),
        output_tokens_per_s=_pick(args.output_tps, 1_000.0),
        prefill_tokens_per_s=_pick(args.prefill_tps, 20_000.0),
        repeats=_pick(args.rollout_repeats, 1 if q else 3),
        renderer=renderer,
        profile_dir=profile_dir,
        baseline_tree=args.baseline_tree,
    )
    sc = scale.ScaleOptions(
        connections=_pick(args.connections, 100 if q else 1_000),
        context_tokens=_pick(args.context_tokens, 4_000 if q else 16_000),
        turns=_pick(args.scale_turns, 3 if q else 10),
        renderer=renderer,
        tracemalloc=args.tracemalloc,
        profile_dir=profile_dir,
    )
    ti = tiers.TiersOptions(
        target_tokens=_pick(args.tiers_target_tokens, 100_000),
        tokens_per_turn=_pick(args.tokens_per_turn, 2_000),
        samples=_pick(args.tiers_samples, 5 if q else 10),
        renderer=renderer,
    )
    return {"overhead": ov, "rollout": ro, "scale": sc, "tiers": ti}


def _bar(enabled: bool, total: int, desc: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    if not enabled:
        return (lambda n: None), (lambda: None)
    tqdm: Any = importlib.import_module("tqdm").tqdm  # no stubs needed: types-tqdm is optional

    bar = tqdm(total=total, desc=desc, unit="turn", file=sys.stderr, leave=True)

    def tick(n: int) -> None:
        if bar.n + n > bar.total:
            bar.total = bar.n + n
        bar.update(n)

    return tick, bar.close


def run_scenarios(names: Sequence[str], opts: dict[str, Any], progress: bool) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names:
        started = time.perf_counter()
        if name == "overhead":
            ov: overhead.OverheadOptions = opts[name]
            lanes = 3 * (2 if ov.baseline_tree else 1)
            tick, close = _bar(progress, overhead.estimated_turns(ov) * lanes * ov.repeats, "overhead")
            results[name] = overhead.run(ov, tick)
        elif name == "rollout":
            ro: rollout.RolloutOptions = opts[name]
            lanes = 3 * (2 if ro.baseline_tree else 1)
            tick, close = _bar(progress, rollout.turns_per_rollout(ro) * lanes * ro.repeats, "rollout")
            results[name] = rollout.run(ro, tick)
        elif name == "tiers":
            ti: tiers.TiersOptions = opts[name]
            tick, close = _bar(progress, tiers.estimated_turns(ti), "tiers")
            results[name] = tiers.run(ti, tick)
        else:
            sc: scale.ScaleOptions = opts[name]
            tick, close = _bar(progress, scale.steps(sc), "scale")
            results[name] = scale.run(sc, tick)
        close()
        results[name]["seconds"] = time.perf_counter() - started
    return results


def describe_tree(tree: Path) -> dict[str, Any]:
    """A source tree: its directory, and its git commit and whether it has changes (if a checkout)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(tree), *args], capture_output=True, text=True, timeout=30
            )
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    commit = git("log", "-1", "--format=%h %s")
    return {
        "dir": str(tree),
        "commit": commit if commit is None or len(commit) <= 72 else commit[:71] + "…",
        "modified": None if status is None else bool(status),
    }


def _baseline_error(args: argparse.Namespace, names: Sequence[str]) -> str | None:
    """Why ``--baseline-tree`` cannot run as asked (``None``: it can, or it is not given)."""
    if args.baseline_tree is None:
        return None
    tree = Path(args.baseline_tree)
    if not (tree / "benchmarks" / "suite" / "runner.py").is_file() or not (
        tree / "responses_cache"
    ).is_dir():
        return f"--baseline-tree {tree}: not a checkout of this repository (no responses_cache/ and benchmarks/suite/)"
    other = [s for s in names if s not in COMPARED]
    if other:
        return f"--baseline-tree compares {' and '.join(COMPARED)} only, not {', '.join(other)}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [
        "--"
    ]:  # ``python -m benchmarks.suite -- --quick`` (argparse.REMAINDER keeps the ``--``)
        argv = argv[1:]
    args = _parser().parse_args(argv)
    if args.baseline_tree is not None:
        args.baseline_tree = str(Path(args.baseline_tree).resolve())
    default = COMPARED if args.baseline_tree else SCENARIOS
    scenarios = ",".join(default) if args.scenarios is None else args.scenarios
    names = [s.strip() for s in scenarios.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        print(
            f"unknown scenario(s): {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    error = _baseline_error(args, names)
    if error:
        print(error, file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    renderer, note = resolve_renderer(args.renderer)
    if note:
        print(f"WARNING: {note}", file=sys.stderr)
    opts = options(args, renderer, str(out.resolve()) if args.profile else None)
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > cpus / 2:
        print(
            f"WARNING: load average {load:.2f} on {cpus} CPUs: other work will make the figures noisy",
            file=sys.stderr,
        )
    started = time.time()
    results: dict[str, Any] = {
        "meta": {
            "command": "python -m benchmarks.suite " + " ".join(argv),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "renderer": renderer,
            "renderer_note": note,
            "quick": args.quick,
            "loadavg_start": list(os.getloadavg()),
        }
    }
    if args.baseline_tree:
        results["meta"]["trees"] = {
            CURRENT: describe_tree(ROOT),
            BASELINE: describe_tree(Path(args.baseline_tree)),
        }
    results.update(run_scenarios(names, opts, progress=not args.no_progress))
    results["meta"]["seconds"] = time.time() - started
    results["meta"]["loadavg_end"] = list(os.getloadavg())
    results["targets"] = targets(results)
    write_json(results, out / "results.json")
    if "overhead" in results:
        plot_overhead(results["overhead"], out / "overhead.png")
    print(render_text(results))
    print(
        f"\nwrote {out / 'results.json'}"
        + (f" and {out / 'overhead.png'}" if "overhead" in results else "")
    )
    return 0


__all__ = ["COMPARED", "SCENARIOS", "describe_tree", "main", "options", "run_scenarios"]
