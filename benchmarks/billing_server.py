"""Turn latency of the real server with a 200 ms billing sink vs. no billing, side by side.

Starts two servers in this process (simulated engine, realistic timing by default): one without
billing, one whose sink sleeps ``--sink-delay`` per write. A WebSocket agent loop runs turns
against both, alternating turn by turn so both see the same machine noise, and prints p50/p95
turn latency (send → ``response.completed``) and the ratio.

    python benchmarks/billing_server.py --turns 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from websockets.asyncio.client import connect

from responses_cache import Biller, SimulatedConfig, SimulatedEngine, create_app
from responses_cache.testing import serve_in_thread


class SleepySink:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.count = 0

    async def write(self, records: Any) -> None:
        await asyncio.sleep(self.delay)
        self.count += len(records)

    async def close(self) -> None:
        pass


async def timed_turns(url: str, turns: int, out: list[float], gate: asyncio.Queue[None], done: asyncio.Queue[None]) -> None:
    """One WebSocket client's chain of turns, each let go by ``gate``; its times go to ``out``."""
    async with connect(url, max_size=None, compression=None) as ws:
        previous = None
        for _ in range(turns):
            await gate.get()
            body = {"type": "response.create", "model": "sim-1", "input": "next step", "previous_response_id": previous}
            start = time.perf_counter()
            await ws.send(json.dumps(body))
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == "response.completed":
                    break
            out.append(time.perf_counter() - start)
            previous = event["response"]["id"]
            await done.put(None)


async def main_async(turns: int, delay: float, instant: bool) -> dict[str, Any]:
    config = SimulatedConfig(instant=instant)
    plain = create_app(backend=SimulatedEngine(config))
    sink = SleepySink(delay)
    biller = Biller(sink, flush_interval=0.0)
    billed = create_app(backend=SimulatedEngine(config), billing=biller)
    servers = [serve_in_thread(plain), serve_in_thread(billed)]
    try:
        results: dict[str, list[float]] = {"none": [], "sink": []}
        gates = {k: asyncio.Queue[None]() for k in results}
        dones = {k: asyncio.Queue[None]() for k in results}
        tasks = [
            asyncio.create_task(timed_turns(server.ws_url, turns, results[name], gates[name], dones[name]))
            for name, server in zip(results, servers, strict=True)
        ]
        for _ in range(turns):  # alternate: one turn on each server, never both at once
            for name in results:
                await gates[name].put(None)
                await dones[name].get()
        await asyncio.gather(*tasks)
    finally:
        for server in servers:
            server.stop()
    p50 = {k: statistics.median(v) * 1000 for k, v in results.items()}
    p95 = {k: statistics.quantiles(v, n=20)[18] * 1000 for k, v in results.items()}
    return {"turns": turns, "sink_delay_s": delay, "p50_ms": p50, "p95_ms": p95,
            "ratio_p50": p50["sink"] / p50["none"], "ratio_p95": p95["sink"] / p95["none"], "billed": sink.count}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--sink-delay", type=float, default=0.2)
    parser.add_argument("--instant", action="store_true", help="zero-latency engine (measures overhead only)")
    args = parser.parse_args()
    result = asyncio.run(main_async(args.turns, args.sink_delay, args.instant))
    print(f"{'mode':<6} {'p50 ms':>8} {'p95 ms':>8}")
    for mode in ("none", "sink"):
        print(f"{mode:<6} {result['p50_ms'][mode]:8.2f} {result['p95_ms'][mode]:8.2f}")
    print(f"ratio sink/none: p50 {result['ratio_p50']:.3f}  p95 {result['ratio_p95']:.3f}  (records billed: {result['billed']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
