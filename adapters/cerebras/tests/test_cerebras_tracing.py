"""Trace context reaches Cerebras: the client's ``traceparent`` goes on with each engine request,
on the token path and the chat path alike."""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.sync.client import connect

from responses_cache import create_app, get_renderer
from responses_cache.backends import load_backend
from responses_cache.testing import ChatReply, FakeCerebras

ENC = get_renderer("harmony").encoding
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize("mode", ["tokens", "chat"])
def test_the_clients_trace_context_reaches_cerebras(responses_cache_server_factory: Any, mode: str) -> None:
    engine = FakeCerebras(
        ENC, ["<|channel|>final<|message|>Hi.<|return|>"], chat_script=[ChatReply(content="Hi.")]
    )
    url = f"http://127.0.0.1:{responses_cache_server_factory(engine.app()).port}"
    backend = load_backend("cerebras", model="gpt-oss-120b", base_url=url, api_key="csk-test", served_models=["gpt-oss"],
                           warm_tcp_connection=False, max_retries=0, modes={"gpt-oss": mode})
    server = responses_cache_server_factory(create_app(backend=backend, renderer="harmony"))
    with connect(server.ws_url, additional_headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-oss", "input": "hi", "store": False}))
        while (event := json.loads(ws.recv()))["type"] not in ("response.completed", "response.failed", "error"):
            pass
    assert event["type"] == "response.completed", event
    (received,) = engine.generation_requests()
    assert received.headers["traceparent"] == TRACEPARENT and received.headers["tracestate"] == "vendor=1"
