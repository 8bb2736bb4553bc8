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


def test_bridge_example_continues_with_full_context(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(_load("bridge_existing_app").app)
    with connect(server.ws_url, max_size=None) as ws:
        first = _turn(ws, input="Hello!", store=False)
        second = _turn(ws, input="again", store=False, previous_response_id=first["response"]["id"])
    assert first["type"] == second["type"] == "response.completed"
    # The wrapped app rendered the whole conversation: more input tokens than the first turn.
    assert second["response"]["usage"]["input_tokens"] > first["response"]["usage"]["input_tokens"]


def test_sdk_tool_loop_example(responses_cache_server_factory: Any, monkeypatch: Any, capsys: Any) -> None:
    server = responses_cache_server_factory()
    module = _load("sdk_websocket_tool_loop")
    monkeypatch.setattr(sys, "argv", ["x"])
    assert module.main(server.http_url) == 0
    assert "Last line of its output" in capsys.readouterr().out
