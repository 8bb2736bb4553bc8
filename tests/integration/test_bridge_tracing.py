"""The bridge passes the client's trace context on to the wrapped app's ``POST /v1/responses``,
so the app's own spans (its OpenTelemetry instrumentation) join the client's trace."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from test_bridge import KEY, foreign_app
from websockets.sync.client import connect

from responses_cache import WebSocketMode

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class HeaderLog:
    """Records the headers of every HTTP request to the app it wraps."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[dict[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            self.seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


def test_the_clients_traceparent_reaches_the_bridged_app(responses_cache_server_factory: Any) -> None:
    inner, _ = foreign_app()
    logged = HeaderLog(inner)
    server = responses_cache_server_factory(WebSocketMode(logged))
    headers = {"Authorization": f"Bearer {KEY}", "traceparent": TRACEPARENT}
    with connect(server.ws_url, additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "foreign-1", "input": "hello", "store": False}))
        while (event := json.loads(ws.recv()))["type"] not in ("response.completed", "response.failed", "error"):
            pass
    assert event["type"] == "response.completed", event
    assert [h.get("traceparent") for h in logged.seen] == [TRACEPARENT]
