"""The examples stay true to the code: each runs against a live server."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _turn(ws: Any, **body: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", "model": "sim-1", **body}))
    while (event := json.loads(ws.recv(timeout=30)))["type"] not in ("response.completed", "response.failed", "error"):
        pass
    return dict(event)


class Recorder:
    """An ASGI wrapper that keeps the JSON body of every ``POST /v1/responses`` it passes on."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/responses":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        self.bodies.append(json.loads(b"".join(chunks)))
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def test_bridge_example_continues_with_full_context(responses_cache_server_factory: Any) -> None:
    module = _load("bridge_existing_app")
    server = responses_cache_server_factory(module.app)
    backend = module.app.service.core.delegate_misses  # the bridge's backend: what the app is sent
    backend.app = recorder = Recorder(backend.app)
    with connect(server.ws_url, max_size=None) as ws:
        first = _turn(ws, input="Hello!", store=False)
        second = _turn(ws, input="again", store=False, previous_response_id=first["response"]["id"])
    assert first["type"] == second["type"] == "response.completed"
    # The wrapped app got the whole conversation: the first input, the first answer, the new input.
    (answer,) = first["response"]["output"]
    sent = recorder.bodies[-1]["input"]
    assert [(i.get("role"), i.get("type", "message")) for i in sent] == [
        ("user", "message"), ("assistant", "message"), ("user", "message")]
    assert json.dumps(sent[0]).count("Hello!") == 1 and json.dumps(sent[2]).count("again") == 1
    assert sent[1]["content"][0]["text"] == answer["content"][0]["text"]
    assert "previous_response_id" not in recorder.bodies[-1]
    # ... and rendered it: more input tokens than the first turn.
    assert second["response"]["usage"]["input_tokens"] > first["response"]["usage"]["input_tokens"]


def test_sdk_tool_loop_example(responses_cache_server_factory: Any, monkeypatch: Any, capsys: Any) -> None:
    server = responses_cache_server_factory()
    module = _load("sdk_websocket_tool_loop")
    monkeypatch.setattr(sys, "argv", ["x"])
    assert module.main(server.http_url) == 0
    assert "Last line of its output" in capsys.readouterr().out
