"""The official SDK (strict validation) with ``item_reference`` inputs and a custom (freeform) tool,
over HTTP (``responses.create``, streamed and not) and over WebSocket (``responses.connect()``).

The simulated engine calls the custom tool when the user's message holds a fenced block, so one
conversation exercises: a reference to an earlier output message, a ``custom_tool_call`` streamed
with ``response.custom_tool_call_input.delta``/``.done``, its ``custom_tool_call_output``, and a
replay of the whole conversation made of references only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from openai import BadRequestError, OpenAI
from wsclient import check_event, check_stream

from responses_cache import SimulatedConfig, SimulatedEngine

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Apply a patch to the working tree.",
        "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'},
    },
    {"type": "web_search"},  # a hosted tool: echoed, never offered to the model
]

Send = Callable[[dict[str, Any]], list[dict[str, Any]]]


def client_for(server: Any) -> OpenAI:
    return OpenAI(base_url=server.http_url, api_key="sk-local", max_retries=0, _strict_response_validation=True)


def http_sender(client: OpenAI) -> Send:
    def send(body: dict[str, Any]) -> list[dict[str, Any]]:
        events = [event.to_dict() for event in client.responses.create(stream=True, **body)]
        for d in events:
            check_event(d)
        return events

    return send


def ws_sender(conn: Any) -> Send:
    def send(body: dict[str, Any]) -> list[dict[str, Any]]:
        conn.response.create(**body)
        events: list[dict[str, Any]] = []
        while True:
            data = conn.recv_bytes()
            d = json.loads(data)
            check_event(d)
            assert conn.parse_event(data).type == d["type"]
            events.append(d)
            if d["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
                return events

    return send


def conversation(send: Send) -> None:
    """The conversation both transports run (each body is a complete create)."""
    base = {"model": "sim-1", "tools": TOOLS, "store": True}
    first = check_stream(send({**base, "input": "Say hello"}))
    (msg,) = first["output"]
    assert msg["type"] == "message" and msg["id"].startswith("msg_")
    assert first["tools"] == TOOLS

    ask = {"role": "user", "content": f"Please apply this:\n```\n{PATCH}```"}
    events = send({**base, "input": [{"role": "user", "content": "Say hello"}, {"type": "item_reference", "id": msg["id"]}, ask]})
    second = check_stream(events)
    (call,) = second["output"]
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch" and call["input"] == PATCH
    assert call["id"].startswith("ctc_") and call["call_id"]
    kinds = [e["type"] for e in events]
    deltas = [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(deltas) == PATCH and len(deltas) > 1
    (done,) = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert done["input"] == PATCH and done["item_id"] == call["id"]
    assert kinds.index("response.custom_tool_call_input.done") < kinds.index("response.output_item.done")

    output = {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "Applied.\nDone: hello.txt"}
    third = check_stream(send({**base, "input": [output], "previous_response_id": second["id"]}))
    (answer,) = third["output"]
    assert answer["type"] == "message" and "Done: hello.txt" in answer["content"][0]["text"]

    # The whole conversation again, every earlier item by reference: the same model-visible
    # conversation, so the next answer is an answer to the new message.
    refs = [{"type": "item_reference", "id": i} for i in (msg["id"], call["id"], answer["id"])]
    replay = [{"role": "user", "content": "Say hello"}, refs[0], ask, refs[1], output, refs[2], {"role": "user", "content": "Thanks"}]
    fourth = check_stream(send({**base, "input": replay}))
    assert fourth["output"][0]["content"][0]["text"].startswith("Simulated answer to: Thanks")

    # An id nobody produced: a precise 400 naming the reference.
    bad = send({**base, "input": [{"role": "user", "content": "x"}, {"type": "item_reference", "id": "msg_nope"}]})
    assert bad[-1]["type"] == "error", bad
    assert bad[-1]["error"]["code"] == "item_not_found" and bad[-1]["error"]["param"] == "input[1].id"


def test_sdk_over_http(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory()
    client = client_for(server)

    def send(body: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            return http_sender(client)(body)
        except Exception as exc:  # an HTTP 400 before the stream: the SDK raises
            status = getattr(exc, "status_code", None)
            if status is None:
                raise
            body_json = exc.body  # type: ignore[attr-defined]
            return [{"type": "error", "status": status, "error": body_json}]

    with client:
        conversation(send)
        # Non-streamed, strictly validated by the SDK itself: a response holding a custom tool call.
        ask = f"Apply:\n```\n{PATCH}```"
        response = client.responses.create(model="sim-1", input=ask, tools=TOOLS)  # type: ignore[arg-type]
        (call,) = response.output
        assert call.type == "custom_tool_call" and call.input == PATCH


def test_sdk_over_websocket(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory()
    client = client_for(server)
    with client, client.responses.connect() as conn:
        conversation(ws_sender(conn))
    assert server.app.state.metrics.total("responses_completed_total", transport="websocket") == 4


def test_websocket_references_to_unstored_items_stay_on_their_connection(responses_cache_server_factory: Any) -> None:
    """``store: false`` output is referenceable on its own connection only."""
    server = responses_cache_server_factory(backend=SimulatedEngine(SimulatedConfig(instant=True)))
    client = client_for(server)
    with client:
        with client.responses.connect() as conn:
            send = ws_sender(conn)
            first = check_stream(send({"model": "sim-1", "input": "Say hello", "store": False}))
            ref = {"type": "item_reference", "id": first["output"][0]["id"]}
            check_stream(send({"model": "sim-1", "input": [ref, {"role": "user", "content": "Again"}], "store": False}))
        with client.responses.connect() as other:
            events = ws_sender(other)({"model": "sim-1", "input": [ref], "store": False})
        assert events[-1]["error"]["code"] == "item_not_found"
        with pytest.raises(BadRequestError) as caught:
            client.responses.create(model="sim-1", input=[ref])  # type: ignore[list-item]
        assert caught.value.code == "item_not_found" and caught.value.param == "input[0].id"
