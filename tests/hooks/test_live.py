"""Hooks in a live server (uvicorn on loopback), over raw HTTP (httpx) and WebSocket (websockets):
a ``before`` flag blocks the turn before ``response.created``; an ``alongside`` flag stops the
running response (``response.incomplete``/``content_filter``, or ``response.failed`` by policy)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from hookhelpers import Gate, GatedBackend, GatedHook
from websockets.asyncio.client import connect

from responses_cache.pipeline.hooks import HookRunner
from responses_cache.safety import PatternPolicy, SecretDetector

KEY = "ghp_" + "a" * 36
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
STOPPED = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
COMPLETED = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def _sse(server: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    with httpx.stream(
        "POST", f"{server.http_url}/responses", json={**body, "stream": True}, timeout=10
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line[6:] != "[DONE]":
                events.append(json.loads(line[6:]))
    return events


async def _ws_turn(ws: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    await ws.send(json.dumps({"type": "response.create", **body}))
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 30))
        events.append(event)
        if event["type"] in (*TERMINAL, "error"):
            return events


def _gated_server(factory: Any, *, late_flag: str = "incomplete", before: bool = False) -> Any:
    gate = Gate()
    hooks: list[Any] = [GatedHook(PatternPolicy(keywords=["forbidden"], phase="alongside"), gate)]
    if before:
        hooks.append(SecretDetector())
    from responses_cache import create_app

    app = create_app(backend=GatedBackend(gate), renderer=None, hooks=hooks)
    app.state.service.core.pipeline.hooks = HookRunner(hooks, late_flag=late_flag)  # type: ignore[arg-type]
    return factory(app)


def test_http_before_flag_is_a_400_envelope(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(hooks=[SecretDetector()])
    r = httpx.post(
        f"{server.http_url}/responses",
        json={"model": "sim-1", "input": f"my key {KEY}"},
        timeout=10,
    )
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "type": "invalid_request_error",
            "code": "secret_detected",
            "param": "input",
            "message": "The input contains a secret (github_token); remove it and try again.",
        }
    }
    # Streaming too: the error comes before any event (no response.created).
    r = httpx.post(
        f"{server.http_url}/responses",
        json={"model": "sim-1", "input": KEY, "stream": True},
        timeout=10,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "secret_detected"
    ok = httpx.post(
        f"{server.http_url}/responses", json={"model": "sim-1", "input": "hello"}, timeout=10
    )
    assert ok.status_code == 200 and ok.json()["status"] == "completed"


def test_http_redaction_reaches_the_stored_input(
    responses_cache_server_factory: Any, recording_backend: Any
) -> None:
    server = responses_cache_server_factory(hooks=[SecretDetector("redact")], backend=recording_backend)
    r = httpx.post(
        f"{server.http_url}/responses",
        json={"model": recording_backend.models()[0], "input": f"use {KEY}"},
        timeout=10,
    )
    assert r.status_code == 200
    (request,) = recording_backend.requests
    texts = [getattr(i, "content", None) for i in request.conversation.items()]
    assert texts[0] == "use [REDACTED:github_token]"


async def test_ws_before_flag_is_an_error_event(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(hooks=[SecretDetector()])
    async with connect(server.ws_url) as ws:
        ok = await _ws_turn(ws, {"model": "sim-1", "input": "hello"})
        assert ok[-1]["type"] == "response.completed"
        events = await _ws_turn(
            ws,
            {
                "model": "sim-1",
                "input": f"key {KEY}",
                "previous_response_id": ok[-1]["response"]["id"],
            },
        )
        assert len(events) == 1
        (error,) = events
        assert error["type"] == "error" and error["status"] == 400
        assert error["error"]["code"] == "secret_detected" and error["error"]["param"] == "input"
        # The connection survives and continues from the last accepted response.
        again = await _ws_turn(
            ws,
            {"model": "sim-1", "input": "sorry", "previous_response_id": ok[-1]["response"]["id"]},
        )
        assert again[-1]["type"] == "response.completed"


def _assert_stopped(events: list[dict[str, Any]], terminal: str) -> dict[str, Any]:
    assert [e["type"] for e in events] == [*STOPPED, terminal]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["Hello"]
    response: dict[str, Any] = events[-1]["response"]
    assert response["status"] == terminal.removeprefix("response.")
    assert response["output"][0]["status"] == "incomplete"
    assert response["output"][0]["content"][0]["text"] == "Hello"
    return response


def test_http_late_flag_ends_incomplete_content_filter(responses_cache_server_factory: Any) -> None:
    server = _gated_server(responses_cache_server_factory)
    assert [e["type"] for e in _sse(server, {"model": "gated-1", "input": "fine"})] == COMPLETED
    response = _assert_stopped(
        _sse(server, {"model": "gated-1", "input": "this is forbidden"}), "response.incomplete"
    )
    assert response["incomplete_details"] == {"reason": "content_filter"}
    assert response["error"] is None


def test_http_late_flag_failed_policy(responses_cache_server_factory: Any) -> None:
    server = _gated_server(responses_cache_server_factory, late_flag="failed")
    response = _assert_stopped(
        _sse(server, {"model": "gated-1", "input": "forbidden"}), "response.failed"
    )
    assert response["error"] == {
        "code": "content_filter",
        "message": "The input was flagged by a content policy.",
    }
    assert response["incomplete_details"] is None


@pytest.mark.parametrize("late_flag", ["incomplete", "failed"])
async def test_ws_late_flag(responses_cache_server_factory: Any, late_flag: str) -> None:
    server = _gated_server(responses_cache_server_factory, late_flag=late_flag, before=True)
    async with connect(server.ws_url) as ws:
        first = await _ws_turn(ws, {"model": "gated-1", "input": "fine"})
        assert [e["type"] for e in first] == COMPLETED
        blocked = await _ws_turn(
            ws,
            {"model": "gated-1", "input": KEY, "previous_response_id": first[-1]["response"]["id"]},
        )
        assert [e["type"] for e in blocked] == ["error"]
        events = await _ws_turn(
            ws,
            {
                "model": "gated-1",
                "input": "forbidden",
                "previous_response_id": first[-1]["response"]["id"],
            },
        )
        response = _assert_stopped(events, f"response.{late_flag}")
        if late_flag == "incomplete":
            assert response["incomplete_details"] == {"reason": "content_filter"}
        else:
            assert response["error"]["code"] == "content_filter"


async def test_ws_blocked_continuation_evicts_its_parent_as_docs_say(responses_cache_server_factory: Any) -> None:
    """docs/hooks.md: over WebSocket a rejected same-lane continuation evicts its parent, so a
    ``store: false`` client resends the conversation in full; with ``store: true`` it continues."""
    server = _gated_server(responses_cache_server_factory, before=True)
    async with connect(server.ws_url) as ws:
        for store in (False, True):
            first = await _ws_turn(ws, {"model": "gated-1", "input": "fine", "store": store})
            parent = first[-1]["response"]["id"]
            blocked = await _ws_turn(ws, {"model": "gated-1", "input": KEY, "previous_response_id": parent, "store": store})
            assert [e["type"] for e in blocked] == ["error"] and blocked[0]["status"] == 400
            retry = await _ws_turn(ws, {"model": "gated-1", "input": "again", "previous_response_id": parent, "store": store})
            if store:
                assert retry[-1]["type"] == "response.completed"
            else:
                assert retry[-1]["type"] == "error"
                assert retry[-1]["error"]["code"] == "previous_response_not_found"
                history = [{"role": "user", "content": "fine"}, *first[-1]["response"]["output"],
                           {"role": "user", "content": "again"}]
                full = await _ws_turn(ws, {"model": "gated-1", "input": history, "store": False})
                assert full[-1]["type"] == "response.completed"
