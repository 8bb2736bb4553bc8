"""Turn latency with overlapped billing.

Runs the same sequential agent loop (N turns, one after another) in several modes and prints
p50/p95 turn latency per mode plus its ratio to the no-billing baseline:

* ``none``    — the turn does not bill at all (baseline);
* ``overlap`` — the turn calls ``Biller.submit(record)``; the sink sleeps ``--sink-delay``
  (default 200 ms) per write, in the background;
* ``inline``  — (``--inline``) the turn awaits that slow sink itself: what overlapping avoids.

The turn function is pluggable: ``--turn package.module:function`` names an
``async def turn(i: int, bill: Callable[[UsageRecord], None]) -> None`` that does one turn
(e.g. one ``response.create`` against a real server) and calls ``bill(record)`` when its
response is finished. The default is a simulated turn that "generates" for ``--turn-ms``.

    python benchmarks/billing_overlap.py --turns 200
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

from responses_cache.billing import Biller, UsageRecord

Bill = Callable[[UsageRecord], None]
TurnFn = Callable[[int, Bill], Awaitable[None]]


def make_turn(turn_ms: float) -> TurnFn:
    """A simulated turn: generate for ``turn_ms``, then bill the finished response."""

    async def simulated_turn(i: int, bill: Bill) -> None:
        created = time.time()
        await asyncio.sleep(turn_ms / 1000)  # stands in for validate/render/generate
        bill(
            UsageRecord(
                response_id=f"resp_bench_{i:08d}",
                tenant="bench",
                model="simulated",
                route="local",
                status="completed",
                input_tokens=1200 + i,
                cached_tokens=1100 + i,
                output_tokens=64,
                reasoning_tokens=16,
                created_at=created,
                finished_at=time.time(),
                transport="websocket",
                previous_response_id=f"resp_bench_{i - 1:08d}" if i else None,
            )
        )

    return simulated_turn


def load_turn(spec: str) -> TurnFn:
    module, _, name = spec.partition(":")
    return cast(TurnFn, getattr(importlib.import_module(module), name))


async def run_turns(turn: TurnFn, bill: Bill, turns: int) -> list[float]:
    latencies = []
    for i in range(turns):
        start = time.perf_counter()
        await turn(i, bill)
        latencies.append(time.perf_counter() - start)
    return latencies


class SlowSink:
    """A sink that takes ``delay`` seconds per write (a remote billing service)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.writes = 0
        self.records = 0

    async def write(self, records: Sequence[UsageRecord]) -> None:
        await asyncio.sleep(self.delay)
        self.writes += 1
        self.records += len(records)

    async def close(self) -> None:
        pass


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def main(args: argparse.Namespace) -> None:
    turn = load_turn(args.turn) if args.turn else make_turn(args.turn_ms)
    results: dict[str, list[float]] = {}
    notes: dict[str, str] = {}

    def no_billing(record: UsageRecord) -> None:
        pass

    results["none"] = await run_turns(turn, no_billing, args.turns)

    sink = SlowSink(args.sink_delay)
    biller = Biller(sink)
    async with biller:
        results["overlap"] = await run_turns(turn, biller.submit, args.turns)
        drain_start = time.perf_counter()
    drain = time.perf_counter() - drain_start
    notes["overlap"] = (
        f"{sink.records}/{args.turns} records in {sink.writes} writes; "
        f"stop() drained in {drain * 1000:.0f} ms"
    )

    if args.inline:
        inline_sink = SlowSink(args.sink_delay)
        pending: list[Awaitable[None]] = []

        def bill_inline(record: UsageRecord) -> None:
            pending.append(inline_sink.write([record]))

        async def inline_turn(i: int, bill: Bill) -> None:
            await turn(i, bill)
            while pending:
                await pending.pop()

        results["inline"] = await run_turns(inline_turn, bill_inline, args.inline_turns)
        notes["inline"] = f"{inline_sink.records} records, awaited in the turn"

    base50, base95 = percentile(results["none"], 50), percentile(results["none"], 95)
    print(f"turn latency, sink delay {args.sink_delay * 1000:.0f} ms per write")
    print(f"{'mode':<8} {'turns':>6} {'p50 ms':>9} {'p95 ms':>9} {'p50 x':>7} {'p95 x':>7}")
    for mode, values in results.items():
        p50, p95 = percentile(values, 50), percentile(values, 95)
        print(
            f"{mode:<8} {len(values):>6} {p50 * 1000:>9.3f} {p95 * 1000:>9.3f} "
            f"{p50 / base50:>7.3f} {p95 / base95:>7.3f}"
        )
    for mode, note in notes.items():
        print(f"  {mode}: {note}")
    print(f"  submit() itself: {await submit_cost(turn):.2f} us per call (queue not full)")


async def submit_cost(turn: TurnFn, calls: int = 100_000) -> float:
    """Microseconds per ``Biller.submit`` on a Biller whose worker has not run yet."""
    records: list[UsageRecord] = []
    await turn(0, records.append)  # borrow one record from the turn function
    biller = Biller(SlowSink(0), queue_size=calls + 1)
    start = time.perf_counter()
    for _ in range(calls):
        biller.submit(records[0])
    elapsed = time.perf_counter() - start
    await biller.stop()
    return elapsed / calls * 1e6


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=200, help="turns per mode")
    parser.add_argument("--turn-ms", type=float, default=5.0, help="simulated turn work")
    parser.add_argument("--sink-delay", type=float, default=0.2, help="seconds per sink write")
    parser.add_argument("--turn", help="module:function of a custom turn function")
    parser.add_argument("--inline", action="store_true", help="also measure inline billing")
    parser.add_argument("--inline-turns", type=int, default=20, help="turns for --inline")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
