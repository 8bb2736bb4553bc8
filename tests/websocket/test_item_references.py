"""``item_reference`` fidelity and scoping, with the recording backend.

A conversation sent with references renders to the same prompt (token for token) as the same
conversation sent in full, over WebSocket and HTTP; references are resolved per tenant, from the
connection, the stored-item index, or the parent's conversation; a deleted response's items are
no longer found.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from backends import RecordingBackend, user_key
from wsclient import MODEL, RENDERER, function_tool, ws_connect

TOOLS = [function_tool()]
INSTRUCTIONS = "You are a careful coding agent."


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def ref(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "item_reference", "id": item["id"]}


def prompt_of(backend: RecordingBackend, tag: str) -> list[int] | None:
    prompt = backend.by_tag(tag).request.prompt
    return list(prompt.tokens()) if prompt is not None else None


def assert_same_context(backend: RecordingBackend, a: str, b: str) -> None:
    assert backend.by_tag(a).identities() == backend.by_tag(b).identities()
    if RENDERER is not None:
        pa, pb = prompt_of(backend, a), prompt_of(backend, b)
        assert pa is not None and pa == pb


def post(server: Any, key: str | None = None, **body: Any) -> httpx.Response:
    body.setdefault("model", MODEL)
    body.setdefault("instructions", INSTRUCTIONS)
    body.setdefault("tools", TOOLS)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.http_url}/responses", json=body, headers=headers, timeout=15)


def ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_references_render_the_same_prompt_as_the_full_conversation_over_websocket(
    serve: Any, backend: RecordingBackend
) -> None:
    server = serve()
    body = {"instructions": INSTRUCTIONS, "tools": TOOLS, "store": True}
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(input=[user("hi")], metadata={"tag": "w1", "text": "hello there"}, **body)
        (msg,) = first["output"]
        second = await ws.ok(
            input=[user("hi"), ref(msg), user("run it")],
            metadata={"tag": "w2", "call": "run", "args": json.dumps({"step": 1}), "call_id": "call_w"},
            **body,
        )
        (call,) = second["output"]
        output = {"type": "function_call_output", "call_id": "call_w", "output": "ran"}
        # A fresh request (no previous_response_id) made of references on the same connection…
        await ws.ok(input=[user("hi"), ref(msg), user("run it"), ref(call), output, user("next")], metadata={"tag": "w-refs"}, **body)
    # …and on a new connection (the stored-item index), against the same conversation in full.
    async with ws_connect(server.ws_url) as ws:
        await ws.ok(input=[user("hi"), ref(msg), user("run it"), ref(call), output, user("next")], metadata={"tag": "w-refs2"}, **body)
        await ws.ok(input=[user("hi"), msg, user("run it"), call, output, user("next")], metadata={"tag": "w-full"}, **body)
    assert_same_context(backend, "w-refs", "w-full")
    assert_same_context(backend, "w-refs2", "w-full")
    # The turn that referenced the message saw it exactly as a full input would have shown it.
    assert backend.by_tag("w2").identities()[1] == backend.by_tag("w-full").identities()[1]


async def test_references_over_http_follow_the_store(serve: Any, backend: RecordingBackend) -> None:
    server = serve()
    first = ok(post(server, input=[user("hi")], metadata={"tag": "h1", "text": "hello there"}))
    (msg,) = first["output"]
    ok(post(server, input=[user("hi"), ref(msg), user("more")], metadata={"tag": "h-refs"}))
    ok(post(server, input=[user("hi"), msg, user("more")], metadata={"tag": "h-full"}))
    assert_same_context(backend, "h-refs", "h-full")

    # Items of the input are referenceable too (they were stored with the response).
    ok(post(server, input=[{**user("with an id"), "id": "msg_client_1"}], metadata={"tag": "h2"}))
    ok(post(server, input=[{"id": "msg_client_1"}], metadata={"tag": "h-input-ref"}))  # ``type`` may be left out
    assert backend.by_tag("h-input-ref").identities() == [user_key("with an id")]

    # The process's index lost track (a restart, say): the parent's conversation still has it.
    server.app.state.service.core.pipeline.stored_items.clear()
    r = post(server, input=[ref(msg)])
    assert r.status_code == 400 and r.json()["error"]["code"] == "item_not_found"
    assert r.json()["error"]["param"] == "input[0].id"
    ok(post(server, input=[ref(msg), user("and?")], previous_response_id=first["id"], metadata={"tag": "h-parent"}))
    assert backend.by_tag("h-parent").identities()[1] == backend.by_tag("h-full").identities()[1]

    # Deleting a response makes its items unreferenceable.
    third = ok(post(server, input=[user("short-lived")], metadata={"tag": "h3"}))
    ok(post(server, input=[ref(third["output"][0])], store=False, metadata={"tag": "h4"}))
    assert httpx.delete(f"{server.http_url}/responses/{third['id']}").status_code == 200
    r = post(server, input=[user("x"), ref(third["output"][0])])
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[1].id"


async def test_references_are_scoped_by_tenant(serve: Any, backend: RecordingBackend) -> None:
    server = serve(api_keys={"sk-a": "tenant-a", "sk-b": "tenant-b"})
    first = ok(post(server, "sk-a", input=[user("secret plans")], metadata={"tag": "a1"}))
    reference = [ref(first["output"][0])]
    ok(post(server, "sk-a", input=reference, metadata={"tag": "a2"}))
    r = post(server, "sk-b", input=reference)
    assert r.status_code == 400 and r.json()["error"]["code"] == "item_not_found"
    async with ws_connect(server.ws_url, additional_headers={"authorization": "Bearer sk-b"}) as ws:
        error = await ws.error(model=MODEL, input=reference)
    assert error["error"]["code"] == "item_not_found" and error["error"]["param"] == "input[0].id"
    assert [c.metadata.get("tag") for c in backend.calls] == ["a1", "a2"]


async def test_unresolvable_reference_keeps_the_socket_open(serve: Any) -> None:
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        error = await ws.error(model=MODEL, input=[user("x"), {"type": "item_reference", "id": "rs_unknown"}])
        assert error["status"] == 400 and error["error"]["param"] == "input[1].id"
        response = await ws.ok(model=MODEL, input=[user("still here")])
        assert response["status"] == "completed"


async def test_a_resend_made_of_references_reuses_the_cached_conversation(serve: Any, backend: RecordingBackend) -> None:
    """References are resolved before the full-input match: a client resending its history as
    references (the Vercel AI SDK's pattern) continues from the cache, rendering only what is new."""
    server = serve()
    body = {"instructions": INSTRUCTIONS, "tools": TOOLS}
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(input=[user("hi")], metadata={"tag": "r1", "text": "hello there"}, **body)
        second = await ws.ok(input=[user("hi"), ref(first["output"][0]), user("more")], metadata={"tag": "r2"}, **body)
    metrics = server.app.state.metrics
    assert metrics.total("full_input_reuse_total", transport="websocket") == 1
    # Only the new user message was new to this turn; the conversation the engine saw is whole.
    assert [i[:2] for i in backend.by_tag("r2").identities()] == [("message", "user"), ("message", "assistant"), ("message", "user")]
    if RENDERER is not None:
        assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0
