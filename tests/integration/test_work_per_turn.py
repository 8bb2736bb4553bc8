"""Per-turn work on the WebSocket path is proportional to the new input, not to the history.

Counted, not timed: tokens encoded by the renderer, items validated, tool lists parsed.
"""

from __future__ import annotations

import itertools
from typing import Any

from websockets.sync.client import connect

from responses_cache import Scenario, SimulatedConfig, SimulatedEngine, create_app
from responses_cache.backends.routing import Route, StaticRouter
from responses_cache.protocol import tools as tools_module
from responses_cache.tokens import get_renderer
from tests.websocket.wsclient import completed_turn

TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
OUTPUT = "def handler(event):\n    return {'status': 200, 'body': event['body']}\n" * 40  # ~1k tokens


def test_tokens_encoded_and_items_validated_do_not_grow_with_history(responses_cache_server_factory: Any) -> None:
    renderer = get_renderer("harmony")
    engine = SimulatedEngine(SimulatedConfig(instant=True, scenario=Scenario(tool_calls=1000, argument_tokens=30)))
    route = Route("default", "sim-1", engine, renderer)
    app = create_app(router=StaticRouter({"sim-1": route}, default=route))
    server = responses_cache_server_factory(app)
    validator = app.state.service.core.pipeline.validator
    encoded: list[int] = []
    checked: list[int] = []
    cached: list[int] = []
    with connect(server.ws_url, max_size=None, compression=None) as ws:
        response = completed_turn(ws, {"model": "sim-1", "input": "start the task", "tools": TOOLS})
        parsed_before = tools_module.tool_cache.parses
        for _ in range(12):
            call = next(o for o in response["output"] if o["type"] == "function_call")
            before_tokens, before_items = renderer.stats.tokens_encoded, validator.items_checked
            response = completed_turn(ws, {
                "model": "sim-1", "tools": TOOLS, "previous_response_id": response["id"],
                "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": OUTPUT}],
            })
            encoded.append(renderer.stats.tokens_encoded - before_tokens)
            checked.append(validator.items_checked - before_items)
            cached.append(response["usage"]["input_tokens_details"]["cached_tokens"])
        assert tools_module.tool_cache.parses == parsed_before  # identical tools: parsed once
    assert checked == [1] * 12
    # The history grows by ~1k tokens a turn; the work per turn stays the same.
    assert len(set(encoded)) == 1, encoded
    assert encoded[0] < 2 * renderer.count_text(OUTPUT)
    assert all(b > a for a, b in itertools.pairwise(cached))  # the reused prefix grows


def _long_loop(server: Any, renderer: Any, turns: int, **options: Any) -> list[tuple[dict[str, Any], int]]:
    """A tool loop on the scenario engine; per turn, the response and the tokens encoded for it."""
    out: list[tuple[dict[str, Any], int]] = []
    with connect(server.ws_url, max_size=None, compression=None) as ws:
        response = completed_turn(ws, {"model": "sim-1", "input": "start the task", "tools": TOOLS, **options})
        for _ in range(turns):
            call = next(o for o in response["output"] if o["type"] == "function_call")
            before = renderer.stats.tokens_encoded
            response = completed_turn(ws, {
                "model": "sim-1", "tools": TOOLS, "previous_response_id": response["id"], **options,
                "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": OUTPUT[:600]}],
            })
            out.append((response, renderer.stats.tokens_encoded - before))
    return out


def _scenario_app(**options: Any) -> Any:
    renderer = get_renderer("harmony")
    engine = SimulatedEngine(SimulatedConfig(instant=True, scenario=Scenario(tool_calls=1000, argument_tokens=30)))
    route = Route("default", "sim-1", engine, renderer, context_window=4000)
    return create_app(router=StaticRouter({"sim-1": route}, default=route), **options), renderer


def test_after_a_truncation_turns_append_again(responses_cache_server_factory: Any) -> None:
    app, renderer = _scenario_app()
    turns = _long_loop(responses_cache_server_factory(app), renderer, 60, truncation="auto")
    cut = [i for i, (r, _) in enumerate(turns) if "truncation_details" in r]
    assert len(cut) >= 3
    steady = {work for i, (_, work) in enumerate(turns) if i not in cut}
    # Every turn that did not cut encodes the same (its tool output and the last call): O(new input).
    assert len(steady) == 1, steady
    assert all(turns[i][1] > next(iter(steady)) for i in cut)  # a cut renders what it kept, once


def test_after_a_compaction_turns_append_again(responses_cache_server_factory: Any) -> None:
    from responses_cache.conversation.sealing import Sealer, new_key

    app, renderer = _scenario_app(sealer=Sealer.from_text(new_key()))
    managed = [{"type": "compaction", "compact_threshold": 2500}]
    turns = _long_loop(responses_cache_server_factory(app), renderer, 60, context_management=managed)
    compacted = [i for i, (r, _) in enumerate(turns) if r["output"][0]["type"] == "compaction"]
    assert len(compacted) >= 3
    steady = {work for i, (_, work) in enumerate(turns) if i not in compacted}
    assert len(steady) == 1, steady
