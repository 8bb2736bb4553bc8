"""The official SDK as the client: ``client.responses.connect()`` (sync) and
``AsyncOpenAI().responses.connect()`` (async) run a 20-turn tool loop against the live server.

The SDK parses leniently (clients.md §1), so each frame is read raw (``recv_bytes``), validated
strictly (``wsclient.check_event``) and only then parsed with the SDK's own ``parse_event``.
"""

from __future__ import annotations

import json
from typing import Any

from openai import AsyncOpenAI, OpenAI
from wsclient import RENDERER, TERMINAL, check_event, check_stream

from responses_cache import Scenario, SimulatedConfig, SimulatedEngine

TURNS = 20
TOOLS = [
    {
        "type": "function",
        "name": "apply_patch",
        "description": "Apply one step of the refactoring.",
        "parameters": {
            "type": "object",
            "properties": {"step": {"type": "integer"}, "note": {"type": "string"}},
            "required": ["step", "note"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]


def engine() -> SimulatedEngine:
    return SimulatedEngine(
        SimulatedConfig(instant=True, scenario=Scenario(tool_calls=TURNS - 1, argument_tokens=10, answer_tokens=20))
    )


class Loop:
    """The client side of the tool loop, shared by the sync and async tests."""

    def __init__(self, stream_id: str | None) -> None:
        self.stream_id = stream_id
        self.responses: list[Any] = []
        self.events: list[dict[str, Any]] = []

    def first(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "sim-1", "input": "Refactor the parser, one step at a time.", "tools": TOOLS, "store": False}
        if self.stream_id is not None:
            body["stream_id"] = self.stream_id
        return body

    def on_frame(self, data: bytes, parsed: Any) -> bool:
        """Validate one frame; True when it ends the response."""
        d = json.loads(data)
        check_event(d)
        assert parsed.type == d["type"]
        assert getattr(parsed, "stream_id", None) == self.stream_id
        self.events.append(d)
        return d["type"] in TERMINAL or d["type"] == "error"

    def run(self, conn: Any) -> None:
        """The whole loop on a sync SDK connection (``client.responses.connect()``)."""
        body: dict[str, Any] | None = self.first()
        while body is not None:
            conn.response.create(**body)
            while True:
                data = conn.recv_bytes()
                event = conn.parse_event(data)
                if self.on_frame(data, event):
                    break
            body = self.next_request(event)

    def next_request(self, final: Any) -> dict[str, Any] | None:
        """Check a finished turn and build the next create (``None`` after the last turn)."""
        turn = len(self.responses) + 1
        response = check_stream(self.events)
        self.events = []
        assert final.type == "response.completed" and final.response.id == response["id"]
        assert response["status"] == "completed"
        previous = self.responses[-1].id if self.responses else None
        assert final.response.previous_response_id == previous
        if RENDERER is not None and turn > 1:
            assert final.response.usage.input_tokens_details.cached_tokens > 0
        self.responses.append(final.response)
        calls = [item for item in final.response.output if item.type == "function_call"]
        if turn == TURNS:
            assert calls == [] and final.response.output[0].type == "message"
            assert final.response.output[0].content[0].text
            return None
        (call,) = calls
        assert call.name == "apply_patch" and json.loads(call.arguments)["step"] == turn
        body: dict[str, Any] = {
            "model": "sim-1",
            "previous_response_id": final.response.id,
            "input": [{"type": "function_call_output", "call_id": call.call_id, "output": f"step {turn} applied"}],
            "tools": TOOLS,
            "store": False,
        }
        if self.stream_id is not None:
            body["stream_id"] = self.stream_id
        return body


def test_sync_sdk_runs_a_20_turn_tool_loop(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(backend=engine())
    client = OpenAI(base_url=server.http_url, api_key="sk-local", max_retries=0)
    loop = Loop(stream_id=None)
    with client, client.responses.connect() as conn:
        loop.run(conn)
    assert len(loop.responses) == TURNS
    assert server.app.state.metrics.total("cache_hits_total") == TURNS - 1


async def test_async_sdk_runs_a_20_turn_tool_loop_on_a_lane(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(backend=engine())
    client = AsyncOpenAI(base_url=server.http_url, api_key="sk-local", max_retries=0)
    loop = Loop(stream_id="agent-1")
    async with client, client.responses.connect() as conn:
        body: dict[str, Any] | None = loop.first()
        while body is not None:
            await conn.response.create(**body)
            while True:
                data = await conn.recv_bytes()
                event = conn.parse_event(data)
                if loop.on_frame(data, event):
                    break
            body = loop.next_request(event)
    assert len(loop.responses) == TURNS
    assert server.app.state.metrics.total("cache_hits_total") == TURNS - 1
