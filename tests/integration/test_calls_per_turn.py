"""A WebSocket turn makes as many calls of the package's code at 100k tokens of history as at
10k: nothing walks the conversation, the token log or the items per turn (O(new input)).

Counted, not timed: every Python call into ``responses_cache`` (``sys.setprofile``) while one turn
runs, the app driven in one event loop through its ASGI interface, a tool loop whose every output
adds ~2k tokens. The simulated engine, and what it calls, is left out of the count: it is the engine
(it looks back for the user's task to plan its next call, as a model reads its context)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, MutableMapping
from types import FrameType
from typing import Any

from benchmarks.suite.workload import code_text, tool_output, tools, user_message
from responses_cache import Scenario, SimulatedConfig, SimulatedEngine, create_app

TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
SCOPE: dict[str, Any] = {
    "type": "websocket", "path": "/v1/responses", "raw_path": b"/v1/responses", "query_string": b"",
    "headers": [(b"host", b"test")], "scheme": "ws", "server": ("test", 80), "client": ("127.0.0.1", 1),
    "subprotocols": [], "asgi": {"version": "3.0"}, "root_path": "", "state": {},
}


def _counter() -> tuple[Callable[[FrameType, str, Any], None], list[int]]:
    calls = [0]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            name, caller = frame.f_code.co_filename, frame.f_back
            by_engine = caller is not None and caller.f_code.co_filename.endswith("simulated.py")
            if "/responses_cache/" in name and not name.endswith("simulated.py") and not by_engine:
                calls[0] += 1

    return profile, calls


async def _calls_per_turn(turns: int, measured: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    engine = SimulatedEngine(SimulatedConfig(instant=True, scenario=Scenario(tool_calls=1_000_000, argument_tokens=40)))
    app = create_app(backend=engine, renderer="harmony", context_window=1 << 22)
    inbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    lifespan_in: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    lifespan_out: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    lifespan = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                         lifespan_in.get, lifespan_out.put))
    await lifespan_in.put({"type": "lifespan.startup"})
    assert (await lifespan_out.get())["type"] == "lifespan.startup.complete"
    await inbox.put({"type": "websocket.connect"})
    connection = asyncio.ensure_future(app(dict(SCOPE), inbox.get, outbox.put))
    assert (await outbox.get())["type"] == "websocket.accept"
    counts: dict[int, tuple[int, int]] = {}
    previous: str | None = None
    new = [user_message("The tests fail in src/parser: find the cause and fix it.")]
    for turn in range(turns):
        body: dict[str, Any] = {"type": "response.create", "model": "sim-1", "input": new, "tools": tools(), "store": False}
        if previous is not None:
            body["previous_response_id"] = previous
        profile, calls = _counter()
        if turn in measured:
            sys.setprofile(profile)
        try:
            await inbox.put({"type": "websocket.receive", "text": json.dumps(body)})
            while (event := json.loads((await outbox.get())["text"]))["type"] not in TERMINAL:
                pass
        finally:
            sys.setprofile(None)
        assert event["type"] == "response.completed", event
        if turn in measured:
            counts[turn] = (event["response"]["usage"]["input_tokens"], calls[0])
        previous = event["response"]["id"]
        call = next(item for item in event["response"]["output"] if item["type"] == "function_call")
        new = [tool_output(call["call_id"], code_text(2000, turn))]
    await inbox.put({"type": "websocket.disconnect", "code": 1000})
    await connection
    await lifespan_in.put({"type": "lifespan.shutdown"})
    await lifespan
    return counts


def test_a_turn_at_100k_tokens_makes_the_calls_a_turn_at_10k_makes() -> None:
    counts = asyncio.run(_calls_per_turn(52, (5, 6, 50, 51)))
    (short_tokens, *_), (long_tokens, *_) = counts[5], counts[50]
    assert short_tokens < 15_000 and long_tokens > 100_000
    short = min(counts[5][1], counts[6][1])
    long = min(counts[50][1], counts[51][1])
    assert short > 300  # the count sees the turn
    assert long <= short * 1.02 + 20, f"{long} calls per turn at {long_tokens} tokens, {short} at {short_tokens}"
