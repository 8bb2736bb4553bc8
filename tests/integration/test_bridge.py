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


def foreign_app() -> tuple[Starlette, list[dict[str, Any]]]:
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
        text = f"I have seen {len(body['input'])} items."
        response = {"id": f"resp_f{len(received)}", "object": "response", "status": "completed", "output": [], "usage": {
            "input_tokens": 10 * len(body["input"]), "input_tokens_details": {"cached_tokens": 0},
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
        event = json.loads(ws.recv())
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
    assert [len(b["input"]) for b in received] == [1, 3]
    assert "previous_response_id" not in received[1] and received[1]["store"] is False
    assert received[1]["input"][1]["role"] == "assistant"
    assert received[1]["input"][1]["content"][0]["text"] == "I have seen 1 items."
    assert received[1]["instructions"] == "be kind"


def test_unknown_stored_parent_is_delegated_to_the_app(responses_cache_server_factory: Any) -> None:
    inner, received = foreign_app()
    server = responses_cache_server_factory(WebSocketMode(inner))
    with connect(server.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        done = _turn(ws, input="more", store=True, previous_response_id="resp_from_http")
        assert done["type"] == "response.completed"
        missing = _turn(ws, input="more", store=False, previous_response_id="resp_gone")
        assert missing["type"] == "error" and missing["error"]["code"] == "previous_response_not_found"
    assert received[0]["previous_response_id"] == "resp_from_http" and len(received[0]["input"]) == 1


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
        first = json.loads(ws.recv())
        while first["type"] not in ("response.completed", "response.failed", "error"):
            first = json.loads(ws.recv())
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
    from responses_cache.bridge import _translate

    added = {"type": "response.output_item.added", "output_index": 0,
             "item": {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "apply_patch", "input": ""}}
    assert _translate(added) == [ToolCallStart(name="apply_patch", call_id="call_1", custom=True)]
    delta = {"type": "response.custom_tool_call_input.delta", "item_id": "ctc_1", "output_index": 0, "delta": "*** Begin"}
    assert _translate(delta) == [ToolCallDelta("*** Begin")]
