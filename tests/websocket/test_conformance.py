"""The WebSocket-mode conformance checklist (spec/ws-mode.md, items 1-36) against a live server.

A raw ``websockets`` client talks to uvicorn on a loopback port; every event it receives is
validated strictly against the SDK's types (``wsclient.check_event``). A recording backend
(``backends.RecordingBackend``) shows what generation received, and its gates hold responses open
so that queueing, interleaving and cancellation are asserted from event order, never from time.

Items 37-41 (steering) are in test_steering.py.
Item 42 (HTTP 426 without WebSocket mode) does not apply: this server has WebSocket mode.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest
from backends import RecordingBackend, expected, until, user_key
from websockets.exceptions import InvalidStatus
from wsclient import (
    MODEL,
    RENDERER,
    TERMINAL,
    check_event,
    check_stream,
    function_tool,
    lane_events,
    split_responses,
    ws_connect,
)

from responses_cache.edge.websocket import WebSocketMode
from responses_cache.session.session import SessionConfig

NOT_FOUND = "previous_response_not_found"


def mode_of(server: Any) -> WebSocketMode:
    """The app's WebSocketMode middleware instance (built on the first request)."""
    app = server.app.middleware_stack
    while not isinstance(app, WebSocketMode):
        app = app.app
    return app



def not_found(event: dict[str, Any], rid: str, lane: str | None = None) -> None:
    assert event["type"] == "error" and event["status"] == 400 and event.get("stream_id") == lane
    assert event["error"] == {
        "type": "invalid_request_error",
        "code": NOT_FOUND,
        "message": f"Previous response with id '{rid}' not found.",
        "param": "previous_response_id",
    }


# -- 1, 2: handshake -------------------------------------------------------------------------------


async def test_upgrade_with_bearer_auth_and_beta_headers(serve: Any) -> None:
    """Items 1, 2: GET upgrade (101) on /v1/responses with a Bearer key; bad auth gets HTTP 401
    before the upgrade; OpenAI-Beta values (known or not) are accepted and ignored."""
    server = serve(api_keys=["sk-test"])
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic sk-test"}):
        with pytest.raises(InvalidStatus) as info:
            async with ws_connect(server.ws_url, additional_headers=headers):
                pass
        assert info.value.response.status_code == 401
        body = json.loads(info.value.response.body)
        assert body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "invalid_request_error"
    for beta in ("responses_websockets=2026-02-06", "responses_multi_agent=v1", "made_up=2030-01-01, other=v9"):
        headers = {"Authorization": "Bearer sk-test", "OpenAI-Beta": beta, "x-codex-turn-state": "abc"}
        async with ws_connect(server.ws_url, additional_headers=headers) as ws:
            assert ws.conn.response is not None and ws.conn.response.status_code == 101
            await ws.ok(input="hi")
    async with ws_connect(server.ws_url + "/", additional_headers={"Authorization": "Bearer sk-test"}) as ws:
        await ws.ok(input="trailing slash")


# -- 3, 4, 6, 7: client events ----------------------------------------------------------------------


async def test_bad_frames_get_errors_and_the_socket_stays_open(serve: Any, backend: RecordingBackend) -> None:
    """Items 3, 34: non-JSON, non-object, missing/unknown/non-string ``type`` each get an ``error``
    event (status 400, full error object); the socket stays open and keeps working."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        frames = [
            ("this is not json", None),
            ('["response.create"]', None),
            ("{}", "type"),
            ('{"type": "response.cancel", "response_id": "resp_1"}', "type"),
            ('{"type": "session.update"}', "type"),
            ('{"type": 42}', "type"),
            ('{"type": ["response.create"]}', "type"),
        ]
        for frame, param in frames:
            await ws.send(frame)
            event = await ws.recv()
            assert event["type"] == "error" and event["status"] == 400, event
            assert event["error"]["param"] == param and event["error"]["type"] == "invalid_request_error"
            assert "stream_id" not in event
        await ws.ok(input="still here")
        assert len(backend.calls) == 1


async def test_response_processed_is_silently_ignored(serve: Any) -> None:
    """Item 4: ``response.processed`` gets no answer at all."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(input="hi")
        await ws.send({"type": "response.processed", "response_id": first["id"]})
        await ws.create(input="next", previous_response_id=first["id"], metadata={"tag": "next"})
        events = await ws.finish()
        assert events[0]["type"] == "response.created"  # nothing came for response.processed
        check_stream(events)


async def test_every_create_field_flat_at_top_level(serve: Any, backend: RecordingBackend) -> None:
    """Items 5, 6, 11: a create with every ``POST /v1/responses`` field (plus the WebSocket and Codex
    extras, and ``stream: true``) is accepted flat; settings reach the backend and are echoed."""
    server = serve()
    body = {
        "model": MODEL,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "instructions": "Be brief.",
        "tools": [function_tool()],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "previous_response_id": None,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "low", "summary": "auto"},
        "text": {"format": {"type": "text"}, "verbosity": "low"},
        "max_output_tokens": 256,
        "max_tool_calls": 4,
        "metadata": {"tag": "all", "text": "fine thanks"},
        "prompt": {"id": "pmpt_123", "version": "2", "variables": {"x": "y"}},
        "prompt_cache_key": "cache-key-1",
        "prompt_cache_retention": "24h",
        "prompt_cache_options": {"mode": "default"},
        "safety_identifier": "user-hash-1",
        "service_tier": "auto",
        "temperature": 0.5,
        "top_p": 0.9,
        "top_logprobs": 0,
        "truncation": "disabled",
        "user": "user-1",
        "context_management": [{"type": "compaction", "compact_threshold": 1000}],
        "conversation": None,
        "moderation": {"mode": "default"},
        "stream_options": {"include_obfuscation": False},
        "access_programs": {"programs": []},
        # WebSocket-only / Codex extras
        "stream_id": "all-fields",
        "generate": True,
        "client_metadata": {"originator": "codex_cli_rs"},
        "stream": True,
        "background": False,
    }
    async with ws_connect(server.ws_url) as ws:
        response = await ws.ok(**body)
        for stream in (False, True):
            again = await ws.ok(input="more", previous_response_id=response["id"], store=False, stream=stream)
            assert again["status"] == "completed"
    call = backend.by_tag("all")
    request = call.request
    assert (request.instructions, request.max_output_tokens, request.temperature, request.top_p) == ("Be brief.", 256, 0.5, 0.9)
    assert request.parallel_tool_calls is False and request.reasoning == {"effort": "low", "summary": "auto"}
    assert call.tool_names == ["run"] and call.identities() == [user_key("hi")]
    assert response["instructions"] == "Be brief." and response["store"] is False
    assert response["metadata"] == body["metadata"] and response["temperature"] == 0.5
    assert response["max_output_tokens"] == 256 and response["max_tool_calls"] == 4
    assert response["parallel_tool_calls"] is False and response["tools"][0]["name"] == "run"
    assert response["previous_response_id"] is None
    assert response["output"][0]["content"][0]["text"] == "fine thanks"


async def test_background_true_is_an_error_and_no_response(serve: Any, backend: RecordingBackend) -> None:
    """Items 7, 24, 34: ``background: true`` gets an ``error`` (400, param ``background``), with the
    lane's ``stream_id``, and no response; ``background: false`` works."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        err = await ws.error(input="hi", background=True)
        assert err["status"] == 400 and err["error"]["param"] == "background" and "stream_id" not in err
        err = await ws.error(input="hi", background=True, stream_id="bg")
        assert err["status"] == 400 and err["error"]["param"] == "background" and err["stream_id"] == "bg"
        assert backend.calls == []
        await ws.ok(input="hi", background=False, stream_id="bg")
        assert not any(e["type"] == "response.created" for e in ws.log[:2])


# -- 8-12: events -------------------------------------------------------------------------------------

_ID = re.compile(r"^(resp|msg|fc|call|rs)_[0-9A-Za-z]+$")


def _normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items() if k not in ("created_at", "completed_at")}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    if isinstance(value, str) and _ID.match(value):
        return value.split("_")[0] + "_*"
    return value


async def _sse(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=15) as client:
        reply = await client.post(url + "/responses", json={**body, "stream": True})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in reply.text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"]
        events.append(data)
    return events


async def test_websocket_events_equal_http_sse_payloads(serve: Any) -> None:
    """Items 8, 9, 10, 12: for the same request, WebSocket frames carry exactly the SSE ``data:``
    payloads (JSON only, no ``event:`` line), ``sequence_number`` 0, 1, 2, …, one terminal event."""
    server = serve()
    bodies = [
        {"model": MODEL, "input": "hi", "metadata": {"text": "Hello brave new world"}, "store": False},
        {
            "model": MODEL, "input": "call it", "tools": [function_tool()], "store": False,
            "metadata": {"call": "run", "args": '{"step": 1, "note": "a b c"}', "call_id": "call_abc"},
        },
        {"model": MODEL, "input": "fail", "metadata": {"text": "one two three", "fail_after": "2"}, "store": False},
        {"model": MODEL, "input": "cut", "metadata": {"text": "one two", "finish": "length"}, "store": False},
    ]
    async with ws_connect(server.ws_url) as ws:
        for body in bodies:
            await ws.send({"type": "response.create", **body})
            raw = await asyncio.wait_for(ws.conn.recv(), 15)
            assert isinstance(raw, str) and raw.startswith("{")  # a JSON object, no ``event:`` line
            first = json.loads(raw)
            check_event(first)
            events = [first, *await ws.finish()]
            check_stream(events)
            sse = await _sse(server.http_url, body)
            check_stream(sse)
            assert _normalized(events) == _normalized(sse)


async def test_sequence_numbers_restart_per_response(serve: Any) -> None:
    """Items 9, 10: every response stream on one socket numbers its events from 0."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        previous = None
        for text in ("one", "two words", "three more words"):
            events = await ws.turn(input=text, previous_response_id=previous, metadata={"text": text})
            response = check_stream(events)
            assert events[0]["sequence_number"] == 0
            previous = response["id"]


async def test_completed_response_fields(serve: Any) -> None:
    """Item 11: ``response.completed.response`` has id, object, status, output,
    previous_response_id, store and usage with cached_tokens and reasoning_tokens."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(input="hi", store=False)
        second = await ws.ok(input="again", previous_response_id=first["id"], store=False)
    for response, previous in ((first, None), (second, first["id"])):
        assert response["id"].startswith("resp_") and response["object"] == "response"
        assert response["status"] == "completed" and isinstance(response["output"], list) and response["output"]
        assert response["previous_response_id"] == previous and response["store"] is False
        usage = response["usage"]
        assert isinstance(usage["input_tokens_details"]["cached_tokens"], int)
        assert isinstance(usage["output_tokens_details"]["reasoning_tokens"], int)
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    if RENDERER is not None:
        assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0
        assert first["usage"]["input_tokens_details"]["cached_tokens"] == 0


async def test_function_call_event_grammar(serve: Any) -> None:
    """Item 12: output_item.added → function_call_arguments.delta* → .done → output_item.done,
    with call_id, name and arguments."""
    server = serve()
    args = '{"step": 1, "note": "several words of arguments"}'
    async with ws_connect(server.ws_url) as ws:
        events = await ws.turn(
            input="go", tools=[function_tool()], metadata={"call": "run", "args": args, "call_id": "call_xyz"}
        )
    check_stream(events)
    kinds = [e["type"] for e in events]
    deltas = kinds.count("response.function_call_arguments.delta")
    assert deltas > 1
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        *["response.function_call_arguments.delta"] * deltas,
        "response.function_call_arguments.done", "response.output_item.done", "response.completed",
    ]
    added, done = events[2]["item"], events[-2]["item"]
    assert added["type"] == "function_call" and added["call_id"] == "call_xyz" and added["name"] == "run"
    assert added["arguments"] == "" and added["status"] == "in_progress"
    assert "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta")) == args
    assert events[-3]["arguments"] == args and events[-3]["name"] == "run" and events[-3]["item_id"] == added["id"]
    assert done == {**added, "arguments": args, "status": "completed"}
    assert events[-1]["response"]["output"] == [done]


# -- 13-21: previous_response_id and the cache --------------------------------------------------------


async def test_continuation_with_tool_output_has_full_context(serve: Any, backend: RecordingBackend) -> None:
    """Items 13, 14: continuing the cached latest response with only a function_call_output
    (``store: false``) gives the backend the whole conversation."""
    server = serve()
    tools = [function_tool()]
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(
            input="do it", tools=tools, store=False, metadata={"call": "run", "args": '{"step": 1}', "call_id": "call_1"}
        )
        output = [{"type": "function_call_output", "call_id": "call_1", "output": "step 1 done"}]
        second = await ws.ok(input=output, previous_response_id=first["id"], tools=tools, store=False, metadata={"tag": "2"})
        third = await ws.ok(input="thanks", previous_response_id=second["id"], store=False, metadata={"tag": "3"})
    assert backend.by_tag("2").identities() == expected("do it", first, output)
    assert backend.by_tag("3").identities() == expected("do it", first, output, second, "thanks")
    assert third["previous_response_id"] == second["id"]
    assert server.app.state.service.core.hydrations == 0  # all from the connection cache


async def test_unknown_previous_response_with_store_false(serve: Any) -> None:
    """Items 15, 34: an uncached ``previous_response_id`` with ``store: false`` gets the documented
    ``previous_response_not_found`` error; so does an id the store never had. A ``store: false``
    request has no fallback (§4.1): a stored response that is not in this connection's cache is
    not found for it either (hot cache and store are for ``store: true`` requests)."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        stored = await ws.ok(input="kept", store=True)
    async with ws_connect(server.ws_url) as ws:
        not_found(await ws.error(input="x", previous_response_id="resp_nope", store=False), "resp_nope")
        not_found(await ws.error(input="x", previous_response_id="resp_nope2"), "resp_nope2")
        not_found(await ws.error(input="x", previous_response_id="resp_n", store=False, stream_id="l"), "resp_n", "l")
        not_found(await ws.error(input="x", previous_response_id=stored["id"], store=False), stored["id"])
        await ws.ok(input="x", previous_response_id=stored["id"], store=True)


async def test_store_true_hydrates_on_a_new_connection(serve: Any, backend: RecordingBackend) -> None:
    """Item 16: a persisted (``store: true``) id that is not in the new connection's cache still
    continues, with the whole stored context."""
    server = serve(hot_cache_bytes=0)  # the store tier: no process-wide hot cache
    tools = [function_tool()]
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(input="start", tools=tools, metadata={"call": "run", "args": '{"step": 1}', "call_id": "c1"})
        output = [{"type": "function_call_output", "call_id": "c1", "output": "ok"}]
        second = await ws.ok(input=output, previous_response_id=first["id"], tools=tools)
    async with ws_connect(server.ws_url) as ws:
        third = await ws.ok(input="and now?", previous_response_id=second["id"], metadata={"tag": "hydrated"})
        assert server.app.state.service.core.hydrations == 1
        # the hydrated response is now the lane's latest: the next turn is a cache hit
        await ws.ok(input="more", previous_response_id=third["id"], store=False, metadata={"tag": "cached"})
        assert server.app.state.service.core.hydrations == 1
    assert backend.by_tag("hydrated").identities() == expected("start", first, output, second, "and now?")
    assert backend.by_tag("cached").identities() == expected("start", first, output, second, "and now?", third, "more")


async def test_store_false_ids_die_with_their_connection(serve: Any) -> None:
    """Items 17, 33: a ``store: false`` response from a closed connection is unknown on a new one."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(input="secret", store=False)
        await ws.ok(input="cached", previous_response_id=first["id"], store=False, stream_id="x")
    async with ws_connect(server.ws_url) as ws:
        not_found(await ws.error(input="x", previous_response_id=first["id"], store=False), first["id"])
        not_found(await ws.error(input="x", previous_response_id=first["id"], store=True), first["id"])


async def test_failed_continuation_evicts_its_parent(serve: Any, backend: RecordingBackend) -> None:
    """Item 18: after a continuation from X fails (a 4xx ``error`` or a ``response.failed``), X is
    evicted and a retry from X gets ``previous_response_not_found``; a failed response is no parent."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        x = await ws.ok(input="one", store=False)
        bad = [{"type": "function_call_output", "call_id": "call_unknown", "output": "?"}]
        err = await ws.error(input=bad, previous_response_id=x["id"], store=False)
        assert err["status"] == 400 and err["error"]["param"] == "input[0].call_id"
        not_found(await ws.error(input="retry", previous_response_id=x["id"], store=False), x["id"])

        y = await ws.ok(input="two", store=False)
        events = await ws.turn(input="boom", previous_response_id=y["id"], store=False, metadata={"fail_after": "1"})
        failed = check_stream(events)
        assert failed["status"] == "failed"
        not_found(await ws.error(input="retry", previous_response_id=y["id"], store=False), y["id"])
        not_found(await ws.error(input="retry", previous_response_id=failed["id"], store=False), failed["id"])
        # store: true does not resurrect a failed response either
        z = await ws.ok(input="three")
        events = await ws.turn(input="boom", previous_response_id=z["id"], metadata={"fail_after": "0"})
        failed = check_stream(events)
        not_found(await ws.error(input="retry", previous_response_id=failed["id"]), failed["id"])
        # a fresh chain still works
        await ws.ok(input="fresh", store=False, metadata={"tag": "fresh"})
    assert backend.by_tag("fresh").identities() == [user_key("fresh")]


async def test_null_or_missing_previous_response_starts_fresh(serve: Any, backend: RecordingBackend) -> None:
    """Item 19: ``previous_response_id: null`` or omitted starts a new chain from ``input`` alone."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        await ws.ok(input="old context", store=False)
        await ws.ok(input="fresh one", previous_response_id=None, store=False, metadata={"tag": "null"})
        await ws.ok(input=[{"role": "user", "content": "fresh two"}], store=False, metadata={"tag": "omitted"})
    assert backend.by_tag("null").identities() == [user_key("fresh one")]
    assert backend.by_tag("omitted").identities() == [user_key("fresh two")]


async def test_instructions_and_tools_are_not_inherited(serve: Any, backend: RecordingBackend) -> None:
    """Item 20: a continuation without ``instructions``/``tools`` gets none; resent ones apply."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(input="hi", instructions="Talk like a pirate.", tools=[function_tool("a")], metadata={"tag": "1"})
        second = await ws.ok(input="again", previous_response_id=first["id"], metadata={"tag": "2"})
        third = await ws.ok(
            input="once more", previous_response_id=second["id"], instructions="Be terse.",
            tools=[function_tool("b")], metadata={"tag": "3"},
        )
    one, two, three = (backend.by_tag(t) for t in "123")
    assert (one.request.instructions, one.tool_names) == ("Talk like a pirate.", ["a"])
    assert (two.request.instructions, two.tool_names) == (None, [])
    assert (three.request.instructions, three.tool_names) == ("Be terse.", ["b"])
    assert second["instructions"] is None and second["tools"] == []
    assert third["instructions"] == "Be terse." and [t["name"] for t in third["tools"]] == ["b"]
    assert three.identities() == expected("hi", first, "again", second, "once more")
    if RENDERER is not None:  # the prompt's header is each turn's own, not the parent's log's
        from responses_cache.tokens import get_renderer

        renderer = get_renderer(RENDERER)
        for call in (one, two, three):
            assert call.request.prompt is not None
            full = renderer.render_full(call.request.instructions, call.request.tools, call.items)
            assert list(call.request.prompt.tokens()) == list(renderer.prompt(full))


async def test_generate_false_warm_up(serve: Any, backend: RecordingBackend) -> None:
    """Item 21: ``generate: false`` returns created → in_progress → completed with empty output and
    no model run; the id chains right away, and (``store: true``) several turns later (from the
    store: this server keeps neither a process-wide hot cache nor superseded responses)."""
    server = serve(hot_cache_bytes=0, session=SessionConfig(superseded_keep=0))
    tools = [function_tool()]
    async with ws_connect(server.ws_url) as ws:
        events = await ws.turn(input="context", instructions="Be terse.", tools=tools, generate=False)
        warm = check_stream(events)
        assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.completed"]
        assert warm["output"] == [] and warm["usage"]["output_tokens"] == 0
        assert backend.calls == []
        first = await ws.ok(input=[], previous_response_id=warm["id"], instructions="Be terse.", tools=tools, metadata={"tag": "1"})
        second = await ws.ok(input="next", previous_response_id=first["id"], metadata={"tag": "2"})
        await ws.ok(input="fork", previous_response_id=warm["id"], metadata={"tag": "later"})  # several turns later
        assert server.app.state.service.core.hydrations == 1
    assert backend.by_tag("1").identities() == [user_key("context")]
    assert backend.by_tag("1").request.instructions == "Be terse."
    assert backend.by_tag("2").identities() == expected("context", first, "next")
    assert backend.by_tag("later").identities() == expected("context", "fork")
    assert second["previous_response_id"] == first["id"]


# -- 22-31: queueing and lanes -------------------------------------------------------------------------


async def test_default_lane_queues_without_interleaving(serve: Any, backend: RecordingBackend) -> None:
    """Items 22, 23: a second default-lane create sent while one runs is queued (not rejected) and
    starts only after the first ends; no events interleave; none carries ``stream_id``."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        await ws.create(input="first", metadata={"tag": "A", "gate": "A", "text": "a b c"})
        await ws.create(input="second", metadata={"tag": "B", "text": "d e f"})
        await ws.recv_until(lambda e: e["type"] == "response.output_text.delta")
        await until(lambda: backend.gates.waiting("A"), "A to block")
        backend.gates.release("A")
        await ws.finish()
        await ws.finish()
    a, b = split_responses(ws.log)
    check_stream(a)
    check_stream(b)
    assert ws.log == a + b  # strictly one after the other
    assert all("stream_id" not in e for e in ws.log)
    assert backend.max_active == 1
    assert [c.metadata["tag"] for c in backend.calls] == ["A", "B"]


async def test_named_lane_echoes_stream_id_everywhere(serve: Any) -> None:
    """Items 23, 24: every event of a named lane's response carries its ``stream_id`` (terminal
    events and request errors included); default-lane events carry none."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        ok = await ws.turn(input="hi", stream_id="lane.1", metadata={"text": "x y"})
        failed = await ws.turn(input="hi", stream_id="lane.1", metadata={"fail_after": "1", "text": "x y"})
        cut = await ws.turn(input="hi", stream_id="lane.1", metadata={"finish": "length"})
        errors = [
            await ws.error(input="hi", stream_id="lane.1", previous_response_id="resp_missing", store=False),
            await ws.error(input=[{"type": "bogus"}], stream_id="lane.1"),
            await ws.error(stream_id="lane.1", input="no model", model=None),
        ]
        default = await ws.turn(input="hi")
    for events in (ok, failed, cut):
        check_stream(events)
        assert all(e["stream_id"] == "lane.1" for e in events)
    assert [e[-1]["type"] for e in (ok, failed, cut)] == list(TERMINAL)
    assert all(e["stream_id"] == "lane.1" for e in errors)
    check_stream(default)
    assert all("stream_id" not in e for e in default)


async def test_same_lane_fifo_other_lanes_interleave(serve: Any, backend: RecordingBackend) -> None:
    """Item 25: same-lane requests run FIFO without overlap; different lanes run concurrently and
    their events interleave on the socket."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        await ws.create(input="a1", stream_id="a", metadata={"tag": "a1", "gate": "a1", "text": "a1 x y"})
        await ws.create(input="a2", stream_id="a", metadata={"tag": "a2", "text": "a2 x y"})
        await ws.create(input="b1", stream_id="b", metadata={"tag": "b1", "gate": "b1", "text": "b1 x y"})
        seen: set[str] = set()

        def first_deltas(e: dict[str, Any]) -> bool:
            if e["type"] == "response.output_text.delta":
                seen.add(e["stream_id"])
            return seen == {"a", "b"}

        await ws.recv_until(first_deltas)  # both lanes are mid-response at once
        await until(lambda: backend.gates.waiting("a1") and backend.gates.waiting("b1"), "both lanes to block")
        assert [c.metadata["tag"] for c in backend.calls] == ["a1", "b1"]  # a2 waits behind a1
        backend.gates.release("b1", "a1")
        for _ in range(3):
            await ws.recv_until(lambda e: e["type"] in TERMINAL)
    a1, a2 = split_responses(lane_events(ws.log, "a"))
    (b1,) = split_responses(lane_events(ws.log, "b"))
    for events in (a1, a2, b1):
        check_stream(events)
    position = {id(e): i for i, e in enumerate(ws.log)}
    assert position[id(a1[-1])] < position[id(a2[0])]  # FIFO on lane a
    assert position[id(b1[0])] < position[id(a1[-1])] and position[id(a1[0])] < position[id(b1[-1])]  # overlap
    assert backend.max_active == 2
    assert backend.by_tag("a2").identities() == [user_key("a2")]


async def test_more_than_16_active_responses_are_queued(serve: Any, backend: RecordingBackend) -> None:
    """Item 26: with 16 responses in flight, a 17th (and 18th) create is queued, not rejected, and
    starts when an active one finishes."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        for i in range(18):
            lane = f"l{i}" if i else None  # the default lane counts toward the 16 too
            await ws.create(input=f"n{i}", stream_id=lane, metadata={"tag": f"n{i}", "gate": f"g{i}"})
        created: list[dict[str, Any]] = []
        await ws.recv_until(lambda e: e["type"] == "response.created" and not created.append(e) and len(created) == 16)
        await until(lambda: backend.active == 16, "16 active generations")
        assert sorted(c.metadata["tag"] for c in backend.calls) == sorted(f"n{i}" for i in range(16))
        backend.gates.release("g3")
        await ws.recv_until(lambda e: e["type"] in TERMINAL)  # n3 completes ...
        await ws.recv_until(lambda e: e["type"] == "response.created")  # ... then n16 starts
        await until(lambda: len(backend.calls) == 17, "the 17th to start")
        assert backend.calls[16].metadata["tag"] == "n16"
        backend.gates.release(*(f"g{i}" for i in range(18)))
        while sum(e["type"] in TERMINAL for e in ws.log) < 18:
            await ws.recv()
    assert not any(e["type"] == "error" for e in ws.log)
    assert backend.max_active == 16
    position = {id(e): i for i, e in enumerate(ws.log)}
    n3_done = next(e for e in lane_events(ws.log, "l3") if e["type"] in TERMINAL)
    for lane in ("l16", "l17"):
        assert position[id(lane_events(ws.log, lane)[0])] > position[id(n3_done)]


@pytest.mark.parametrize("stream_id", ["", "x" * 257, "has space", "a/b", "ünicode", "new\nline", 7, ["a"]])
async def test_invalid_stream_id(serve: Any, backend: RecordingBackend, stream_id: Any) -> None:
    """Items 27, 34: an empty or malformed ``stream_id`` gets ``invalid_stream_id`` (400, param
    ``stream_id``) without a ``stream_id`` of its own; a 256-character one is fine."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        err = await ws.error(input="hi", stream_id=stream_id)
        assert err["status"] == 400 and "stream_id" not in err
        assert err["error"]["code"] == "invalid_stream_id" and err["error"]["param"] == "stream_id"
        assert err["error"]["type"] == "invalid_request_error"
        assert backend.calls == []
        longest = "y" * 256
        events = await ws.turn(input="hi", stream_id=longest)
        assert check_stream(events)["status"] == "completed" and events[-1]["stream_id"] == longest


async def test_33rd_named_lane_is_refused(serve: Any) -> None:
    """Item 28: 32 named lanes work; the 33rd distinct name gets ``websocket_stream_limit_reached``
    (400, with its ``stream_id``); existing lanes and the default lane keep working."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        previous: dict[str, str] = {}
        for i in range(32):
            previous[f"s{i}"] = (await ws.ok(input="hi", stream_id=f"s{i}", store=False))["id"]
        err = await ws.error(input="hi", stream_id="s32")
        assert err["stream_id"] == "s32" and err["status"] == 400
        assert err["error"]["code"] == "websocket_stream_limit_reached" and err["error"]["param"] == "stream_id"
        assert err["error"]["message"] == (
            "This WebSocket connection has reached its maximum number of distinct stream IDs (32). "
            "Reuse an existing stream_id or open a new WebSocket connection."
        )
        await ws.ok(input="more", stream_id="s5", previous_response_id=previous["s5"], store=False)
        await ws.ok(input="default lane")
        assert (await ws.error(input="hi", stream_id="s33"))["error"]["code"] == "websocket_stream_limit_reached"


async def test_lane_caches_its_latest_and_forks_inherit(serve: Any, backend: RecordingBackend) -> None:
    """Item 29: a lane keeps only its latest response; a fork onto a new lane from another lane's
    latest inherits its context, and both lanes then continue independently. (Strictly as the spec
    says: without the superseded responses' grace period, see test_session.py.)"""
    server = serve(session=SessionConfig(superseded_keep=0))
    async with ws_connect(server.ws_url) as ws:
        r1 = await ws.ok(input="one", stream_id="a", store=False)
        r2 = await ws.ok(input="two", stream_id="a", previous_response_id=r1["id"], store=False)
        not_found(await ws.error(input="x", stream_id="a", previous_response_id=r1["id"], store=False), r1["id"], "a")
        fork = await ws.ok(input="fork", stream_id="b", previous_response_id=r2["id"], store=False, metadata={"tag": "fork"})
        main = await ws.ok(input="main", stream_id="a", previous_response_id=r2["id"], store=False, metadata={"tag": "main"})
        await ws.ok(input="fork 2", stream_id="b", previous_response_id=fork["id"], store=False, metadata={"tag": "fork2"})
        await ws.ok(input="main 2", stream_id="a", previous_response_id=main["id"], store=False, metadata={"tag": "main2"})
    base = ("one", r1, "two", r2)
    assert backend.by_tag("fork").identities() == expected(*base, "fork")
    assert backend.by_tag("main").identities() == expected(*base, "main")
    assert backend.by_tag("fork2").identities() == expected(*base, "fork", fork, "fork 2")
    assert backend.by_tag("main2").identities() == expected(*base, "main", main, "main 2")


async def test_failing_cross_lane_fork_keeps_the_parent(serve: Any, backend: RecordingBackend) -> None:
    """Item 30: a fork that fails (a 4xx ``error`` or a ``response.failed``) does not evict the
    shared parent; the source lane still continues from it."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        parent = await ws.ok(input="base", stream_id="a", store=False)
        bad = [{"type": "function_call_output", "call_id": "nope", "output": "?"}]
        err = await ws.error(input=bad, stream_id="b", previous_response_id=parent["id"], store=False)
        assert err["stream_id"] == "b" and err["status"] == 400
        events = await ws.turn(input="x", stream_id="c", previous_response_id=parent["id"], store=False, metadata={"fail_after": "0"})
        assert check_stream(events)["status"] == "failed" and events[-1]["stream_id"] == "c"
        await ws.ok(input="fork ok", stream_id="b", previous_response_id=parent["id"], store=False, metadata={"tag": "b"})
        await ws.ok(input="go on", stream_id="a", previous_response_id=parent["id"], store=False, metadata={"tag": "a"})
    assert backend.by_tag("a").identities() == expected("base", parent, "go on")
    assert backend.by_tag("b").identities() == expected("base", parent, "fork ok")


async def test_errors_on_one_lane_leave_other_lanes_alone(serve: Any, backend: RecordingBackend) -> None:
    """Item 31: request-scoped errors (and a failed response) on one lane while another lane's
    response is streaming do not disturb it."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        await ws.create(input="long", stream_id="a", metadata={"tag": "a", "gate": "a", "text": "a b c d"})
        await ws.recv_until(lambda e: e["type"] == "response.output_text.delta")
        err = await ws.error(input="x", stream_id="b", previous_response_id="resp_gone", store=False)
        assert err["stream_id"] == "b"
        err = await ws.error(input="x", stream_id="b", background=True)
        assert err["stream_id"] == "b"
        events = await ws.turn(input="x", stream_id="b", metadata={"fail_after": "0"})
        assert check_stream(events)["status"] == "failed"
        await ws.ok(input="y", stream_id="b")
        await ws.send("garbage")
        assert (await ws.recv())["type"] == "error"
        assert backend.by_tag("a").outcome == "running"
        backend.gates.release("a")
        a_events = await ws.finish("a")
    (a,) = split_responses(lane_events(ws.log, "a"))
    assert a[-1] is a_events[-1]
    response = check_stream(a)
    assert response["status"] == "completed" and response["output"][0]["content"][0]["text"] == "a b c d"


# -- 32, 33, 36: connection lifetime, close, transport -------------------------------------------------


async def test_lifetime_limit_when_idle(serve: Any) -> None:
    """Item 32: at the limit an idle connection gets ``websocket_connection_limit_reached`` (400,
    ``invalid_request_error``, the documented message) and is closed with 1000."""
    config = SessionConfig(lifetime_s=1.0)
    server = serve(session=config)
    async with ws_connect(server.ws_url) as ws:
        await ws.ok(input="hi")
        code, events = await ws.closed()
    assert code == 1000
    (err,) = events
    assert err["status"] == 400 and "stream_id" not in err
    assert err["error"] == {
        "type": "invalid_request_error",
        "code": "websocket_connection_limit_reached",
        "message": config.limit_message.format(minutes=round(config.lifetime_s / 60)),
        "param": None,
    }


async def test_lifetime_limit_finishes_in_flight_work_then_closes(serve: Any, backend: RecordingBackend) -> None:
    """Item 32: a response in flight at the limit finishes; creates after the limit get the error
    (with their lane); then the connection closes with 1000."""
    server = serve(session=SessionConfig(lifetime_s=1.0))
    async with ws_connect(server.ws_url) as ws:
        await ws.create(input="slow", stream_id="a", metadata={"tag": "a", "gate": "a"})
        await ws.recv_until(lambda e: e["type"] == "response.output_text.delta")
        await asyncio.sleep(1.2)  # let the connection age past its lifetime (no timing is asserted)
        err = await ws.error(input="late", stream_id="late")
        assert err["error"]["code"] == "websocket_connection_limit_reached" and err["stream_id"] == "late"
        backend.gates.release("a")
        code, events = await ws.closed()
    assert code == 1000
    (a,) = split_responses(lane_events(ws.log, "a"))
    assert check_stream(a)["status"] == "completed"
    assert [e["type"] for e in events][-1] == "response.completed"  # no second limit error
    assert [c.metadata["tag"] for c in backend.calls] == ["a"]


async def test_closing_cancels_generation_and_discards_state(serve: Any, backend: RecordingBackend) -> None:
    """Item 33 (and §10.3): closing the socket cancels in-flight generation (the backend sees the
    cancellation), drops queued work, frees the connection, and its cache is gone."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        kept = await ws.ok(input="cached", stream_id="a", store=False)
        await ws.create(input="running", stream_id="a", previous_response_id=kept["id"], store=False, metadata={"tag": "run", "gate": "never1"})
        await ws.create(input="queued", stream_id="a", metadata={"tag": "queued"})
        await ws.create(input="other", stream_id="b", metadata={"tag": "other", "gate": "never2"})
        await until(lambda: backend.gates.waiting("never1") and backend.gates.waiting("never2") and len(backend.calls) == 3, "both lanes to block")
    await until(lambda: backend.by_tag("run").outcome != "running" and backend.by_tag("other").outcome != "running", "cancellation")
    assert backend.by_tag("run").outcome in ("cancelled", "closed")
    assert backend.by_tag("other").outcome in ("cancelled", "closed")
    assert backend.active == 0
    mode = mode_of(server)
    await until(lambda: mode.connections == 0, "the connection to end")
    await until(lambda: server.app.state.metrics.total("responses_cancelled_total") == 2, "cancellations billed")
    assert [c.metadata.get("tag") for c in backend.calls] == [None, "run", "other"]  # "queued" never ran
    async with ws_connect(server.ws_url) as ws:
        not_found(await ws.error(input="x", stream_id="a", previous_response_id=kept["id"], store=False), kept["id"], "a")


async def test_abrupt_disconnect_with_a_full_outbound_queue_ends_the_connection(
    serve: Any, backend: RecordingBackend
) -> None:
    """Items 33, §10.3: a client that vanishes (TCP abort, no close frame) while the server has far
    more output queued than fits anywhere still gets its connection torn down and its turn cancelled."""
    server = serve()
    async with ws_connect(server.ws_url, max_queue=1) as ws:
        # ~30 MB of deltas: far more than the kernel's socket buffers on both ends can absorb, so
        # the server is still producing when the client vanishes.
        await ws.create(input="flood", metadata={"tag": "flood", "text": "word " * 200_000})
        await ws.recv_until(lambda e: e["type"] == "response.output_text.delta")
        await until(lambda: backend.by_tag("flood").deltas > 1_100, "the server to be flooding")
        ws.conn.transport.abort()
    mode = mode_of(server)
    await until(lambda: mode.connections == 0, "the connection to end")
    await until(lambda: backend.by_tag("flood").outcome != "running", "generation to stop")
    assert backend.by_tag("flood").outcome in ("cancelled", "closed")
    assert backend.by_tag("flood").deltas < 200_000


async def test_binary_frame_closes_with_1003(serve: Any) -> None:
    """§5.2: a binary frame is a protocol violation: close code 1003."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        await ws.ok(input="hi")
        await ws.conn.send(b'{"type": "response.create"}')
        code, events = await ws.closed()
    assert code == 1003 and events == []


@pytest.mark.parametrize("pad", ["x", "é", "😀"])
async def test_oversized_message_closes_with_1009(serve: Any, pad: str) -> None:
    """§5.2: a message over the configured size limit closes with 1009; the limit is exact (a
    message of the limit's size is a turn, one byte more closes) and counts bytes on the wire,
    not characters (``é`` is two bytes in UTF-8, ``😀`` four)."""
    limit = 2048
    server = serve(max_body_bytes=limit)

    def create_of_size(size: int) -> str:
        empty = json.dumps({"type": "response.create", "model": MODEL, "input": ""})
        count, rest = divmod(size - len(empty), len(pad.encode()))
        text = empty[:-2] + pad * count + "x" * rest + empty[-2:]
        assert len(text.encode()) == size
        return text

    async with ws_connect(server.ws_url) as ws:
        await ws.send(create_of_size(limit))
        assert check_stream(await ws.finish())["status"] == "completed"
        await ws.send(create_of_size(limit + 1))
        code, events = await ws.closed()
    assert code == 1009 and events == []


async def test_ping_and_permessage_deflate(serve: Any) -> None:
    """Item 36: the server answers pings and tolerates a permessage-deflate offer. The spec lets a
    server accept or decline it; this one (uvicorn's default) accepts, so the offer is taken and
    compressed frames go both ways."""
    server = serve()
    async with ws_connect(server.ws_url, compression="deflate") as ws:
        pong = await ws.conn.ping(b"are you there")
        await asyncio.wait_for(pong, 15)
        assert [e.name for e in ws.conn.protocol.extensions] == ["permessage-deflate"]
        done = await ws.ok(input="compressed " * 200, metadata={"text": "long reply " * 50})
        assert done["output"][0]["content"][0]["text"] == "long reply " * 50
        pong = await ws.conn.ping()
        await asyncio.wait_for(pong, 15)
    async with ws_connect(server.ws_url) as ws:  # and without compression
        await asyncio.wait_for(await ws.conn.ping(), 15)


# -- 34, 35: error shapes -----------------------------------------------------------------------------


async def test_generation_failures_are_response_failed(serve: Any, backend: RecordingBackend) -> None:
    """Items 35, 10: a failure after ``response.created`` ends the response with
    ``response.failed`` and ``response.error.{code,message}``, never a bare ``error``."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        for meta in ({"fail_after": "2", "text": "a b c d"}, {"crash": "1", "text": "a b"}, {"fail_after": "0"}):
            events = await ws.turn(input="x", metadata=meta)
            failed = check_stream(events)
            assert events[-1]["type"] == "response.failed" and failed["status"] == "failed"
            assert failed["error"]["code"] == "server_error" and failed["error"]["message"]
        assert not any(e["type"] == "error" for e in ws.log)
        deltas = [e for e in ws.log if e["type"] == "response.output_text.delta"]
        assert len(deltas) == 2 + 1  # what streamed before the failures stayed streamed
        await ws.ok(input="still fine")


async def test_error_events_have_status_and_full_error_objects(serve: Any) -> None:
    """Item 34: every ``error`` event has top-level ``status`` and ``error.{type,code,message,param}``
    (``check_event`` asserts it for each event the suite receives; this collects a variety)."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        errors = []
        for frame in ("{", '{"type": "nope"}'):
            await ws.send(frame)
            errors.append(await ws.recv())
        for body in (
            {"input": "x", "stream_id": ""},
            {"input": "x", "previous_response_id": "resp_x", "store": False},
            {"input": [{"type": "teleport_call"}]},
            {"input": "x", "temperature": "warm"},
            {"input": "x", "conversation": "conv_1"},
            {"input": "no model", "model": None},
        ):
            errors.append(await ws.error(**body))
    for e in errors:
        assert e["type"] == "error"
        assert set(e) >= {"type", "status", "error"} and set(e["error"]) >= {"type", "code", "message", "param"}
        assert e["status"] == 400 and e["error"]["type"] == "invalid_request_error"
    assert [e["error"]["code"] for e in errors] == [
        "invalid_json", "invalid_value", "invalid_stream_id", NOT_FOUND, "invalid_value", "invalid_type",
        "unsupported_parameter", "missing_required_parameter",
    ]
    assert [e["error"]["param"] for e in errors][2:] == [
        "stream_id", "previous_response_id", "input[0].type", "temperature", "conversation", "model",
    ]


def test_the_event_validator_is_strict() -> None:
    """Items 8, 11, 34: ``check_event`` (run on every event this suite receives) rejects events the
    lenient SDK parser would accept."""
    delta = {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
             "delta": "hi", "sequence_number": 3, "logprobs": []}
    check_event(delta)
    usage = {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
             "output_tokens": 1, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 4}
    response = {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "m",
                "output": [], "tools": [], "tool_choice": "auto", "parallel_tool_calls": True, "usage": usage}
    check_event({"type": "response.completed", "sequence_number": 9, "response": response})
    error = {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": None, "message": "m", "param": None}}
    check_event(error)
    no_cache_write = {**usage, "input_tokens_details": {"cached_tokens": 0}}
    bad = [
        {k: v for k, v in delta.items() if k != "logprobs"},
        {k: v for k, v in delta.items() if k != "sequence_number"},
        {**delta, "delta": 5},
        {**delta, "type": "response.bogus"},
        {"type": "response.completed", "sequence_number": 9, "response": {**response, "usage": no_cache_write}},
        {"type": "response.completed", "sequence_number": 9, "response": {k: v for k, v in response.items() if k != "tools"}},
        {k: v for k, v in error.items() if k != "status"},
        {**error, "error": {"type": "invalid_request_error", "message": "m"}},
    ]
    for event in bad:
        with pytest.raises((AssertionError, ValueError)):
            check_event(event)


