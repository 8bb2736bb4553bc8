"""``WebSocketMode(app)`` gives WebSocket mode to a Responses app that knows nothing about it.

The wrapped app here is a small, separately written Responses server (SSE only, no
``previous_response_id`` support, its own bearer check). Every bridged turn must reach it as one
request with the whole conversation.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from responses_cache import WebSocketMode

KEY = "sk-inner"


def foreign_app(*, known_ids: tuple[str, ...] | None = None, refuse: tuple[int, Any] | None = None,
                raise_on_create: bool = False) -> tuple[Starlette, list[dict[str, Any]]]:
    """``known_ids``: the app resolves ``previous_response_id`` against these (``None``: it ignores
    the field); ``refuse``: answer every create with this (status, JSON body); ``raise_on_create``:
    the app raises."""
    received: list[dict[str, Any]] = []

    def authorized(request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {KEY}"

    async def models(request: Request) -> JSONResponse:
        if not authorized(request):
            return JSONResponse({"error": {"message": "bad key", "type": "invalid_request_error", "code": "invalid_api_key", "param": None}}, 401)
        return JSONResponse({"object": "list", "data": [{"id": "foreign-1", "object": "model"}]})

    async def create(request: Request) -> Any:
        if not authorized(request):
            return JSONResponse({"error": {"message": "bad key", "type": "invalid_request_error", "code": "invalid_api_key", "param": None}}, 401)
        body = await request.json()
        received.append(body)
        if raise_on_create:
            raise RuntimeError("the app is broken")
        if refuse is not None:
            return JSONResponse(refuse[1], refuse[0])
        parent = body.get("previous_response_id")
        if known_ids is not None and parent is not None and parent not in known_ids:
            return JSONResponse({"error": {"message": f"Previous response with id '{parent}' not found.",
                                           "type": "invalid_request_error", "code": "previous_response_not_found",
                                           "param": "previous_response_id"}}, 404)
        text = f"I have seen {len(body['input'])} items."
        response = {"id": f"resp_f{len(received)}", "object": "response", "status": "completed", "output": [], "usage": {
            # its own prefix cache: everything but the newest item
            "input_tokens": 10 * len(body["input"]), "input_tokens_details": {"cached_tokens": 10 * (len(body["input"]) - 1)},
            "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}}}
        events = [
            {"type": "response.created", "response": {**response, "status": "in_progress"}},
            {"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "id": "m", "role": "assistant", "content": []}},
            *({"type": "response.output_text.delta", "item_id": "m", "output_index": 0, "content_index": 0, "delta": d} for d in (text[:7], text[7:])),
            {"type": "response.completed", "response": response},
        ]

        async def stream() -> AsyncIterator[bytes]:
            for n, event in enumerate(events):
                yield f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': n})}\n\n".encode()

        return StreamingResponse(stream(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/responses", create, methods=["POST"]), Route("/v1/models", models)])
    return app, received


def _turn(ws: Any, **body: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", "model": "foreign-1", **body}))
    while True:
        event = json.loads(ws.recv(timeout=30))
        if event["type"] in ("response.completed", "response.failed", "error"):
            return dict(event)


def test_bridged_continuations_reach_the_app_with_full_context(responses_cache_server_factory: Any) -> None:
    inner, received = foreign_app()
    server = responses_cache_server_factory(WebSocketMode(inner))
    headers = {"Authorization": f"Bearer {KEY}"}
    with connect(server.ws_url, additional_headers=headers, max_size=None) as ws:
        first = _turn(ws, input="hello", store=False, instructions="be kind")
        assert first["type"] == "response.completed"
        assert first["response"]["output"][0]["content"][0]["text"] == "I have seen 1 items."
        second = _turn(ws, input="and again", store=False, previous_response_id=first["response"]["id"], instructions="be kind")
        assert second["type"] == "response.completed", second
    # The usage is the app's own (the bridge has no prompt to count), its cached prefix included.
    usage = second["response"]["usage"]
    assert (usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], usage["output_tokens"]) == (30, 20, 3)
    assert [len(b["input"]) for b in received] == [1, 3]
    assert "previous_response_id" not in received[1] and received[1]["store"] is False
    assert received[1]["input"][1]["role"] == "assistant"
    assert received[1]["input"][1]["content"][0]["text"] == "I have seen 1 items."
    assert received[1]["instructions"] == "be kind"


def test_unknown_stored_parent_is_delegated_to_an_app_that_resolves_ids(responses_cache_server_factory: Any) -> None:
    inner, received = foreign_app(known_ids=("resp_from_http",))
    mode = WebSocketMode(inner)
    server = responses_cache_server_factory(mode)
    with connect(server.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        done = _turn(ws, input="more", store=True, previous_response_id="resp_from_http")
        assert done["type"] == "response.completed", done
        again = _turn(ws, input="more", store=True, previous_response_id="resp_from_http")
        assert again["type"] == "response.completed"
        unknown = _turn(ws, input="more", store=True, previous_response_id="resp_nowhere")
        assert unknown["type"] == "error" and unknown["status"] == 404
        assert unknown["error"]["code"] == "previous_response_not_found"
        missing = _turn(ws, input="more", store=False, previous_response_id="resp_gone")
        assert missing["type"] == "error" and missing["error"]["code"] == "previous_response_not_found"
    probes = [b for b in received if b["previous_response_id"].startswith("resp_responses_cache_probe_")]
    assert len(probes) == 1  # asked once, then known
    delegated = [b for b in received if b not in probes]
    assert delegated[0]["previous_response_id"] == "resp_from_http" and len(delegated[0]["input"]) == 1


@pytest.mark.parametrize("configured", [None, False])
def test_an_app_that_ignores_previous_response_id_never_gets_one(responses_cache_server_factory: Any, configured: bool | None) -> None:
    inner, received = foreign_app(known_ids=None)
    server = responses_cache_server_factory(WebSocketMode(inner, resolves_previous_response_ids=configured))
    with connect(server.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        for _ in range(2):
            missing = _turn(ws, input="more", store=True, previous_response_id="resp_from_http")
            assert missing["type"] == "error" and missing["error"]["code"] == "previous_response_not_found"
    turns = [b for b in received if not b["previous_response_id"].startswith("resp_responses_cache_probe_")]
    assert turns == []  # never a reply that silently lost its context
    assert len(received) == (1 if configured is None else 0)  # probed once, or configured


def test_the_bridge_forwards_every_field_the_client_set(responses_cache_server_factory: Any) -> None:
    inner, received = foreign_app()
    server = responses_cache_server_factory(WebSocketMode(inner))
    fields = {
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "top_logprobs": 3, "prompt_cache_key": "pk", "user": "u-1", "truncation": "auto",
        "include": ["message.output_text.logprobs"], "max_tool_calls": 2, "service_tier": "flex",
        "safety_identifier": "s", "temperature": 0.5, "top_p": 0.9, "max_output_tokens": 100,
        "metadata": {"k": "v"}, "reasoning": {"effort": "low"}, "tool_choice": "none",
        "parallel_tool_calls": False, "prompt_cache_retention": "24h", "instructions": "be brief",
    }
    with connect(server.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        done = _turn(ws, input="hi", store=False, stream_id="lane", generate=True, **fields)
        assert done["type"] == "response.completed"
    (body,) = received
    for name, value in fields.items():
        assert body[name] == value, name
    assert body["stream"] is True and body["store"] is False
    assert not {"stream_id", "generate", "type", "previous_response_id"} & set(body)


@pytest.mark.parametrize(
    ("status", "body", "message", "code"),
    [
        (400, {"error": {"message": "Unknown parameter: 'x'.", "type": "invalid_request_error", "code": "unknown_parameter", "param": "x"}},
         "Unknown parameter: 'x'.", "unknown_parameter"),
        (404, {"detail": "Model not found"}, "Model not found", None),
        (422, {"detail": [{"loc": ["body", "input"], "msg": "Field required", "type": "missing"}]}, "Field required", None),
        (429, {"unexpected": True}, "The wrapped app answered HTTP 429.", None),
    ],
)
def test_a_refusal_before_streaming_is_an_error_event_with_its_status(
    responses_cache_server_factory: Any, status: int, body: Any, message: str, code: str | None
) -> None:
    inner, _ = foreign_app(refuse=(status, body))
    server = responses_cache_server_factory(WebSocketMode(inner))
    with connect(server.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "foreign-1", "input": "hi"}))
        event = json.loads(ws.recv(timeout=10))  # the first event: no response.created before it
        assert event["type"] == "error" and event["status"] == status, event
        assert event["error"]["message"] == message and event["error"]["code"] == code
        assert _turn(ws, input="still open").get("type") == "error"  # the socket stays open


def test_an_app_that_raises_gives_a_clear_error(responses_cache_server_factory: Any) -> None:
    inner, _ = foreign_app(raise_on_create=True)
    server = responses_cache_server_factory(WebSocketMode(inner))
    with connect(server.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "foreign-1", "input": "hi"}))
        event = json.loads(ws.recv(timeout=10))
        assert event["type"] == "error" and event["status"] == 500
        assert "RuntimeError" in event["error"]["message"] and "HTTP 0" not in event["error"]["message"]


def test_upgrade_is_authorized_by_the_app_and_http_passes_through(responses_cache_server_factory: Any) -> None:
    inner, received = foreign_app()
    server = responses_cache_server_factory(WebSocketMode(inner))
    with pytest.raises(InvalidStatus) as err:
        connect(server.ws_url, additional_headers={"Authorization": "Bearer wrong"})
    assert err.value.response.status_code == 401
    r = httpx.get(f"{server.http_url}/models", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "foreign-1"
    assert received == []


WEB_SEARCH = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "weather", "sources": None}, "extra": [1, 2.50, "é"]}


def test_hosted_items_and_unknown_references_reach_the_app_as_sent(responses_cache_server_factory: Any) -> None:
    """The bridged app may run hosted tools and keeps its own store: hosted-tool items go to it
    byte for byte, and a reference the connection cannot resolve goes to it unresolved."""
    inner, received = foreign_app()
    server = responses_cache_server_factory(WebSocketMode(inner))
    with connect(server.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}, max_size=None) as ws:
        raw = '{"type":"response.create","model":"foreign-1","store":false,"input":[' + json.dumps(WEB_SEARCH) + "]}"
        ws.send(raw)
        first = json.loads(ws.recv(timeout=30))
        while first["type"] not in ("response.completed", "response.failed", "error"):
            first = json.loads(ws.recv(timeout=30))
        assert first["type"] == "response.completed", first
        second = _turn(
            ws, store=False, previous_response_id=first["response"]["id"],
            input=[{"type": "item_reference", "id": "ws_1"}, {"type": "item_reference", "id": "msg_elsewhere"}],
        )
        assert second["type"] == "response.completed", second
    assert received[0]["input"] == [WEB_SEARCH]
    # The earlier hosted item resolved on the connection; the unknown one is the app's to resolve.
    assert received[1]["input"][0] == WEB_SEARCH and received[1]["input"][2] == WEB_SEARCH
    assert received[1]["input"][3] == {"type": "item_reference", "id": "msg_elsewhere"}


def test_the_apps_custom_tool_calls_come_through() -> None:
    from responses_cache.backends.base import ToolCallDelta, ToolCallStart
    from responses_cache.edge.bridge import _translate

    added = {"type": "response.output_item.added", "output_index": 0,
             "item": {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "apply_patch", "input": ""}}
    assert _translate(added) == [ToolCallStart(name="apply_patch", call_id="call_1", custom=True)]
    delta = {"type": "response.custom_tool_call_input.delta", "item_id": "ctc_1", "output_index": 0, "delta": "*** Begin"}
    assert _translate(delta) == [ToolCallDelta("*** Begin")]
