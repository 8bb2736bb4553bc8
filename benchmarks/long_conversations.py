"""Work per turn over a long agent loop with ``truncation: "auto"`` and with ``context_management``
compaction, counted (tokens the renderer encodes), not timed.

A 300-turn tool loop on the scenario engine (instant) over WebSocket mode, in a small context
window: how many turns cut or compacted (rebased) the conversation, what an appending turn and a
rebasing turn encode, the largest prompt, and what the compactions' summaries were billed.

    python benchmarks/long_conversations.py
    python benchmarks/long_conversations.py --turns 1000 --window 8000 --threshold 6000
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from websockets.sync.client import connect

from responses_cache import Scenario, SimulatedConfig, SimulatedEngine, create_app
from responses_cache.backends.routing import Route, StaticRouter
from responses_cache.conversation.sealing import Sealer, new_key
from responses_cache.testing.pytest_plugin import serve_in_thread
from responses_cache.tokens import get_renderer

TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
OUTPUT = "def handler(event):\n    return {'status': 200}\n" * 8


class _Records:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def submit(self, record: Any) -> None:
        self.records.append(record)


def _turn(ws: Any, body: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", **body}))
    while True:
        event = json.loads(ws.recv())
        if event["type"] in ("response.completed", "response.failed", "error"):
            assert event["type"] == "response.completed", event
            return dict(event["response"])


def run(label: str, turns: int, window: int, **options: Any) -> str:
    renderer = get_renderer("harmony")
    engine = SimulatedEngine(SimulatedConfig(instant=True, scenario=Scenario(tool_calls=10**9, argument_tokens=30)))
    route = Route("default", "sim-1", engine, renderer, context_window=window)
    billing = _Records()
    app = create_app(router=StaticRouter({"sim-1": route}, default=route), sealer=Sealer.from_text(new_key()), billing=billing)
    server = serve_in_thread(app)
    work: list[tuple[bool, int, int]] = []
    try:
        with connect(server.ws_url, max_size=None) as ws:
            response = _turn(ws, {"model": "sim-1", "input": "start", "tools": TOOLS, **options})
            for _ in range(turns):
                call = next(o for o in response["output"] if o["type"] == "function_call")
                before = renderer.stats.tokens_encoded
                response = _turn(ws, {
                    "model": "sim-1", "tools": TOOLS, "previous_response_id": response["id"], **options,
                    "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": OUTPUT}],
                })
                rebased = "truncation_details" in response or response["output"][0]["type"] == "compaction"
                work.append((rebased, renderer.stats.tokens_encoded - before, response["usage"]["input_tokens"]))
    finally:
        server.stop()
    rebasing = [w for r, w, _ in work if r]
    appending = [w for r, w, _ in work if not r]
    summaries = [r for r in billing.records if r.response_id.startswith("cmp_")]
    return (
        f"{label}: {turns} turns, {len(rebasing)} rebased; tokens encoded per turn: appending median "
        f"{statistics.median(appending):.0f} (max {max(appending)}), rebasing median "
        f"{statistics.median(rebasing) if rebasing else 0:.0f}; largest prompt {max(p for *_, p in work)} / {window}; "
        f"{len(summaries)} summaries billed ({sum(r.input_tokens for r in summaries)} in, "
        f"{sum(r.output_tokens for r in summaries)} out)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--window", type=int, default=4000)
    parser.add_argument("--threshold", type=int, default=3000)
    args = parser.parse_args()
    print(run("truncation auto", args.turns, args.window, truncation="auto"))
    managed = [{"type": "compaction", "compact_threshold": args.threshold}]
    print(run(f"compaction at {args.threshold}", args.turns, args.window, context_management=managed))


if __name__ == "__main__":
    main()
