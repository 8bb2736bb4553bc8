"""Hosted tools and their items on the native route, the same on both transports.

* A hosted tool in ``tools`` (``web_search``, ``mcp``…) is echoed in the response and never
  offered to the model: the engine sees only the function tools.
* A hosted-tool item in ``input`` is decoded and kept as sent, but the token templates have no
  form for it, so the request is refused (400 ``unsupported_value``, ``param: input[i].type``)
  before anything runs — never dropped silently. A route without a renderer carries it to its
  backend unchanged.
* An item type the API does not define is ``invalid_value``; a hosted item without a field the
  API requires is ``missing_required_parameter`` naming that field.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from backends import RecordingBackend
from wsclient import MODEL, RENDERER, function_tool, ws_connect

from responses_cache.protocol.codec import encode
from responses_cache.protocol.items import HostedItem

HOSTED_TOOLS = [{"type": "web_search"}, {"type": "mcp", "server_label": "deepwiki", "server_url": "https://example.invalid/mcp"}]
LOCAL_SHELL = {
    "type": "local_shell_call", "id": "lsh_1", "call_id": "call_1", "status": "completed",
    "action": {"type": "exec", "command": ["ls", "-la"], "env": {"A": "1"}},
}
CASES: list[tuple[list[dict[str, Any]], int, str, str]] = [
    ([{"role": "user", "content": "x"}, LOCAL_SHELL], 400, "unsupported_value", "input[1].type"),
    ([{"type": "teleport_call", "id": "t"}], 400, "invalid_value", "input[0].type"),
    ([{"type": "mcp_call", "id": "mcp_1", "name": "ask", "server_label": "deepwiki"}], 400, "missing_required_parameter", "input[0].arguments"),
]


def post(server: Any, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.http_url}/responses", json={"model": MODEL, **body}, timeout=15)


async def test_hosted_tools_are_echoed_not_offered_on_both_transports(serve: Any, backend: RecordingBackend) -> None:
    server = serve()
    tools = [*HOSTED_TOOLS, function_tool()]
    r = post(server, input="hi", tools=tools, metadata={"tag": "http"})
    assert r.status_code == 200 and r.json()["tools"] == tools
    async with ws_connect(server.ws_url) as ws:
        response = await ws.ok(model=MODEL, input="hi", tools=tools, metadata={"tag": "ws"})
    assert response["tools"] == tools
    for tag in ("http", "ws"):
        call = backend.by_tag(tag)
        assert call.tool_names == ["run"]
        assert [t.type for t in call.request.tools.hosted()] == ["web_search", "mcp"]
        if RENDERER is not None:
            assert call.request.prompt is not None
            assert "deepwiki" not in call.request.prompt.renderer.decode(call.request.prompt.tokens())


@pytest.mark.skipif(RENDERER is None, reason="the refusal comes from the token templates")
@pytest.mark.parametrize(("items", "status", "code", "param"), CASES)
async def test_hosted_items_get_the_same_answer_on_both_transports(
    serve: Any, backend: RecordingBackend, items: list[dict[str, Any]], status: int, code: str, param: str
) -> None:
    server = serve()
    r = post(server, input=items)
    assert r.status_code == status
    http_error = r.json()["error"]
    async with ws_connect(server.ws_url) as ws:
        event = await ws.error(model=MODEL, input=items)
    assert event["status"] == status and event["error"] == http_error
    assert (http_error["code"], http_error["param"]) == (code, param)
    assert backend.calls == []


async def test_without_a_renderer_hosted_items_reach_the_backend_as_sent(serve: Any, backend: RecordingBackend) -> None:
    server = serve(renderer=None)
    raw = json.dumps(LOCAL_SHELL, separators=(",", ":"))
    output = {"type": "local_shell_call_output", "id": "call_1", "output": "total 0"}
    head = json.dumps({"model": MODEL, "metadata": {"tag": "raw"}})[:-1]
    body = head + ',"input":[' + raw + "," + json.dumps(output) + "]}"
    r = httpx.post(f"{server.http_url}/responses", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    shell, out = backend.by_tag("raw").items
    assert isinstance(shell, HostedItem) and shell.type == "local_shell_call" and shell.id == "lsh_1"
    assert encode(shell) == raw.encode()  # byte for byte
    assert isinstance(out, HostedItem) and json.loads(encode(out)) == output
