"""Turn latency with the write-ahead usage journal (both durability modes) vs. no billing.

Starts servers in this process, all on the simulated engine: one without billing, one whose
Biller journals in ``process`` mode, one in ``machine`` mode (group-committed ``fdatasync``),
and, for reference, one with a Biller but no journal (records in memory). Each billed server
delivers to a JSONL sink. A WebSocket agent loop runs turns against all of them, one turn on
each per round in a shuffled order, so they share the same machine noise, and the script prints p50/p95 turn latency
(send → ``response.completed``) and the ratios to no billing.

    python benchmarks/billing_journal.py --turns 300
    python benchmarks/billing_journal.py --turns 300 --instant   # zero-latency engine: overhead only

The journals live in ``--dir`` (default: a temporary directory under the current directory, so
that ``fdatasync`` hits a real disk rather than a tmpfs).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

from billing_server import (
    timed_turns,  # the same client as billing_server.py (run from benchmarks/)
)

from responses_cache import Biller, JsonlSink, SimulatedConfig, SimulatedEngine, create_app
from responses_cache.testing import serve_in_thread

MODES = ("none", "memory", "process", "machine")




async def main_async(turns: int, instant: bool, directory: Path, warmup: int) -> dict[str, Any]:
    config = SimulatedConfig(instant=instant)
    billers: dict[str, Biller | None] = {
        "none": None,
        "memory": Biller(JsonlSink(directory / "memory.jsonl")),
        "process": Biller(JsonlSink(directory / "process.jsonl"), journal_path=directory / "process.journal"),
        "machine": Biller(
            JsonlSink(directory / "machine.jsonl"), journal_path=directory / "machine.journal", durability="machine"
        ),
    }
    servers = {
        mode: serve_in_thread(create_app(backend=SimulatedEngine(config), billing=billers[mode])) for mode in MODES
    }
    try:
        results: dict[str, list[float]] = {mode: [] for mode in MODES}
        gates = {mode: asyncio.Queue[None]() for mode in MODES}
        dones = {mode: asyncio.Queue[None]() for mode in MODES}
        tasks = [
            asyncio.create_task(timed_turns(servers[mode].ws_url, turns + warmup, results[mode], gates[mode], dones[mode]))
            for mode in MODES
        ]
        order = list(MODES)
        shuffle = random.Random(1234).shuffle
        for _ in range(turns + warmup):  # one turn on each server, never two at once
            shuffle(order)  # so that no mode always follows the same neighbour's background work
            for mode in order:
                await gates[mode].put(None)
                await dones[mode].get()
        await asyncio.gather(*tasks)
    finally:
        for server in servers.values():
            server.stop()
    for mode in MODES:
        del results[mode][:warmup]
    p50 = {k: statistics.median(v) * 1000 for k, v in results.items()}
    p95 = {k: statistics.quantiles(v, n=20)[18] * 1000 for k, v in results.items()}
    billed = {}
    for mode in MODES[1:]:
        path = directory / f"{mode}.jsonl"
        billed[mode] = len(path.read_bytes().splitlines()) if path.exists() else 0
    return {"turns": turns, "instant": instant, "p50_ms": p50, "p95_ms": p95, "billed": billed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=10, help="turns per server not counted")
    parser.add_argument("--instant", action="store_true", help="zero-latency engine (measures overhead only)")
    parser.add_argument("--dir", type=Path, default=None, help="where the journals go (default: a temp dir in .)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir or Path.cwd(), prefix="billing-journal-bench-") as tmp:
        result = asyncio.run(main_async(args.turns, args.instant, Path(tmp), args.warmup))
    engine = "instant engine" if args.instant else "simulated engine, 1,000 tokens/s"
    print(f"turn latency over WebSocket, {args.turns} turns per mode, {engine}")
    print(f"{'mode':<8} {'p50 ms':>8} {'p95 ms':>8} {'p50 x':>7} {'p95 x':>7} {'billed':>7}")
    p50, p95 = result["p50_ms"], result["p95_ms"]
    for mode in MODES:
        billed = result["billed"].get(mode, "-")
        print(
            f"{mode:<8} {p50[mode]:8.3f} {p95[mode]:8.3f} {p50[mode] / p50['none']:7.3f} "
            f"{p95[mode] / p95['none']:7.3f} {billed:>7}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
