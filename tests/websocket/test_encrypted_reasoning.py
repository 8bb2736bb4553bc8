"""``include: ["reasoning.encrypted_content"]`` with ``store: false``: a stateless tool loop keeps
its reasoning through the client, over HTTP (the official SDK, strict) and over WebSocket (every
event validated strictly); tampered, foreign-tenant and foreign-key blobs are a clear 400."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai import OpenAI
from wsclient import check_event, check_stream

from responses_cache.backends.base import (
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from responses_cache.conversation.sealing import Sealer, SealError, new_key
from responses_cache.testing import RecordingBackend, ScriptedBackend, context_of

INCLUDE: list[Any] = ["reasoning.encrypted_content"]
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    }
]
THOUGHT = "The user wants the files listed; I should run ls first."


def _backend() -> RecordingBackend:
    """Reasoning then a tool call, then an answer: a tool loop whose reasoning the next prompt keeps."""
    scripts = [
        [ReasoningDelta(THOUGHT), ToolCallStart(name="exec_command", call_id="call_1"), ToolCallDelta('{"cmd": "ls"}'), Finish("tool_calls")],
        [TextDelta("There is one file."), Finish()],
    ]
    return RecordingBackend(ScriptedBackend(scripts))


def _client(server: Any, key: str = "sk-a") -> OpenAI:
    return OpenAI(base_url=server.http_url, api_key=key, max_retries=0, _strict_response_validation=True)


KEYS = {"sk-a": "tenant-a", "sk-b": "tenant-b"}


def _reasoning_only_blob(item: dict[str, Any]) -> dict[str, Any]:
    """The reasoning item as a stateless client sends it back: its text left out."""
    return {"type": "reasoning", "id": item["id"], "summary": item["summary"], "encrypted_content": item["encrypted_content"]}


def test_a_stateless_http_tool_loop_keeps_its_reasoning(responses_cache_server_factory: Any) -> None:
    sealer = Sealer.from_text(new_key())
    stateless = _backend()
    server = responses_cache_server_factory(backend=stateless, sealer=sealer, api_keys=KEYS)
    client = _client(server)
    first = client.responses.create(model="sim-1", input="List the files.", tools=TOOLS, store=False, include=INCLUDE)
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content and reasoning.encrypted_content.startswith("rcs1.")
    assert THOUGHT not in reasoning.encrypted_content
    assert call.type == "function_call"
    items: list[Any] = [
        {"role": "user", "content": "List the files."},
        _reasoning_only_blob(reasoning.to_dict()),
        call.to_dict(),
        {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"},
    ]
    second = client.responses.create(model="sim-1", input=items, tools=TOOLS, store=False, include=INCLUDE)
    assert second.output_text == "There is one file."

    # The same loop kept by the server (store + previous_response_id): the model saw the same prompt.
    stateful = _backend()
    reference = _client(responses_cache_server_factory(backend=stateful))
    r1 = reference.responses.create(model="sim-1", input="List the files.", tools=TOOLS)
    out = {"type": "function_call_output", "call_id": r1.output[1].call_id, "output": "a.txt"}  # type: ignore[union-attr]
    reference.responses.create(model="sim-1", input=[out], tools=TOOLS, previous_response_id=r1.id)
    assert context_of(stateless.requests[1])["prompt"] == context_of(stateful.requests[1])["prompt"]
    # and the sealed text is what made the difference: without it the reasoning is not in the prompt
    renderer = server.app.state.service.core.router.resolve("sim-1", "").renderer
    assert THOUGHT in renderer.decode(context_of(stateless.requests[1])["prompt"])


def test_bad_blobs_are_refused(responses_cache_server_factory: Any) -> None:
    sealer = Sealer.from_text(new_key())
    server = responses_cache_server_factory(backend=_backend(), sealer=sealer, api_keys=KEYS)
    first = _client(server).responses.create(model="sim-1", input="List the files.", tools=TOOLS, store=False, include=INCLUDE)
    blob = first.output[0].to_dict()["encrypted_content"]
    other_server = Sealer.from_text(new_key()).seal("tenant-a", "reasoning", b"\x90")
    tampered = blob[:-6] + ("A" if blob[-6] != "A" else "B") + blob[-5:]
    cases = [
        (_client(server), tampered),
        (_client(server, "sk-b"), blob),  # another tenant's reasoning
        (_client(server), other_server),  # sealed under another key
        (_client(server), "gAAAA-not-ours"),
        (_client(server), blob[:20]),
    ]
    for client, bad in cases:
        item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": bad}
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model="sim-1", input=[{"role": "user", "content": "x"}, item], store=False)  # type: ignore[list-item]
        assert caught.value.code == "invalid_encrypted_content", bad
        assert caught.value.param == "input[1].encrypted_content"
        assert "rs_1" in caught.value.message
        with pytest.raises(openai.BadRequestError):  # counted input is checked the same way
            client.responses.input_tokens.count(model="sim-1", input=[item])  # type: ignore[list-item]


def test_without_a_key_the_option_does_nothing(responses_cache_server_factory: Any) -> None:
    """Clients such as Codex always ask for it: a server without a key answers as before."""
    server = responses_cache_server_factory(backend=_backend())
    reasoning, _ = _client(server).responses.create(model="sim-1", input="x", store=False, include=INCLUDE).output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content is None


def test_sealing_is_bound_to_tenant_and_purpose() -> None:
    old, new = new_key(), new_key()
    sealer = Sealer.from_text(old)
    blob = sealer.seal("t", "reasoning", b"secret")
    assert sealer.open("t", "reasoning", blob) == b"secret"
    for tenant, purpose in (("u", "reasoning"), ("t", "compaction")):
        with pytest.raises(SealError):
            sealer.open(tenant, purpose, blob)
    assert blob != sealer.seal("t", "reasoning", b"secret")  # a fresh nonce every time
    rotated = Sealer.from_text(new, previous=[old])
    assert rotated.open("t", "reasoning", blob) == b"secret"
    with pytest.raises(SealError):
        Sealer.from_text(new).open("t", "reasoning", blob)
    with pytest.raises(ValueError, match="32"):
        Sealer.from_text("c2hvcnQ=")


def test_websocket_create_seals_and_opens(responses_cache_server_factory: Any) -> None:
    backend = _backend()
    server = responses_cache_server_factory(backend=backend, sealer=Sealer.from_text(new_key()))
    client = _client(server, "sk-local")

    def send(conn: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
        conn.response.create(**body)
        events: list[dict[str, Any]] = []
        while True:
            d = json.loads(conn.recv_bytes())
            check_event(d)
            events.append(d)
            if d["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
                return events

    with client, client.responses.connect() as conn:
        base = {"model": "sim-1", "tools": TOOLS, "store": False, "include": INCLUDE}
        first = check_stream(send(conn, {**base, "input": "List the files."}))
        reasoning, call = first["output"]
        assert reasoning["encrypted_content"].startswith("rcs1.")
        items = [
            {"role": "user", "content": "List the files."},
            _reasoning_only_blob(reasoning),
            call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"},
        ]
        second = check_stream(send(conn, {**base, "input": items}))
        assert second["output"][0]["content"][0]["text"] == "There is one file."
        tampered = {**_reasoning_only_blob(reasoning), "encrypted_content": reasoning["encrypted_content"][:-3] + "xyz"}
        error = send(conn, {**base, "input": [items[0], tampered]})[-1]
        assert error["type"] == "error" and error["status"] == 400
        assert error["error"]["code"] == "invalid_encrypted_content" and error["error"]["param"] == "input[1].encrypted_content"
    renderer = server.app.state.service.core.router.resolve("sim-1", "").renderer
    assert THOUGHT in renderer.decode(context_of(backend.requests[1])["prompt"])
