"""Steering latency: ``response.steer`` sent → the successor's first token, against what a client
can do without steering, side by side in one run against one live server (simulated engine with
realistic timing: prefill 20k tokens/s, decode 1k tokens/s, a block prefix cache).

Each trial: a conversation with ``--history`` tokens of prior context (``store: true``), then a
long answer (``--answer`` tokens) that the client wants to redirect after ``--after`` deltas:

* ``steer`` — send ``response.steer``; time until the successor's first ``output_text.delta``;
* ``wait``  — let the answer finish, then ``response.create`` with ``previous_response_id`` and the
  new input; time from the same moment to that response's first delta;
* ``close`` — close the socket (the server stops generating), open a new connection and continue
  the last completed response (hydrated from the hot cache) with the interrupted request and the
  new input; time from the same moment to the first delta.

    python benchmarks/steering.py
    python benchmarks/steering.py --trials 10 --history 30000 --answer 3000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from responses_cache import SimulatedConfig, SimulatedEngine, create_app
from responses_cache.testing import serve_in_thread

MODEL = "sim-1"
NEW = "Stop there. Summarize what you have in one sentence."


async def _recv(ws: ClientConnection) -> dict[str, Any]:
    return dict(json.loads(await asyncio.wait_for(ws.recv(), 60)))


async def _until(ws: ClientConnection, kind: str) -> dict[str, Any]:
    while True:
        event = await _recv(ws)
        if event["type"] == kind:
            return event
        if event["type"] in ("error", "response.failed", "response.steer.failed"):
            raise RuntimeError(event)


async def _setup(ws: ClientConnection, history_words: int) -> tuple[str, str]:
    """A stored history (warm-up), then a long answer running; returns (history id, answer id)."""
    history = " ".join(f"line {i} of the earlier session." for i in range(history_words // 7))
    await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": history, "generate": False}))
    warm = (await _until(ws, "response.completed"))["response"]["id"]
    await ws.send(json.dumps({"type": "response.create", "model": MODEL, "previous_response_id": warm, "input": "Write the long report."}))
    created = await _until(ws, "response.created")
    return warm, created["response"]["id"]


async def _trial(url: str, strategy: str, history: int, after: int) -> float:
    ws = await connect(url, max_size=None)
    try:
        warm, answer = await _setup(ws, history)
        for _ in range(after):
            await _until(ws, "response.output_text.delta")
        start = time.perf_counter()
        if strategy == "steer":
            await ws.send(json.dumps({"type": "response.steer", "previous_response_id": answer, "input": NEW}))
            await _until(ws, "response.steer.accepted")
            await _until(ws, "response.incomplete")
            await _until(ws, "response.created")
        elif strategy == "wait":
            await _until(ws, "response.completed")
            await ws.send(json.dumps({"type": "response.create", "model": MODEL, "previous_response_id": answer, "input": NEW}))
        else:
            await ws.close()
            ws = await connect(url, max_size=None)
            body = {"type": "response.create", "model": MODEL, "previous_response_id": warm,
                    "input": [{"role": "user", "content": "Write the long report."}, {"role": "user", "content": NEW}]}
            await ws.send(json.dumps(body))
        await _until(ws, "response.output_text.delta")
        return time.perf_counter() - start
    finally:
        await ws.close()


async def _run(url: str, trials: int, history: int, after: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"steer": [], "wait": [], "close": []}
    for _ in range(trials):  # interleaved, so drift hits every strategy alike
        for strategy in results:
            results[strategy].append(await _trial(url, strategy, history, after))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--history", type=int, default=20_000, help="tokens of earlier context (approximate)")
    parser.add_argument("--answer", type=int, default=2_000, help="tokens of the answer being redirected")
    parser.add_argument("--after", type=int, default=50, help="deltas received before redirecting")
    args = parser.parse_args()
    engine = SimulatedEngine(SimulatedConfig(answer_tokens=args.answer))
    server = serve_in_thread(create_app(backend=engine))
    try:
        results = asyncio.run(_run(server.ws_url, args.trials, args.history, args.after))
    finally:
        server.stop()
    steer = statistics.median(results["steer"])
    print(f"history ≈{args.history} tokens, answer {args.answer} tokens, redirected after {args.after} deltas, "
          f"{args.trials} trials each (medians)")
    for name, label in (("steer", "response.steer"), ("wait", "wait, then create"), ("close", "close, reconnect, create")):
        median = statistics.median(results[name])
        print(f"  {label:<26} {median * 1000:9.1f} ms   x{median / steer:7.1f} of steer")


if __name__ == "__main__":
    main()
