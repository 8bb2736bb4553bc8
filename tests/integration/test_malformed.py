"""Every malformed input gets the OpenAI error envelope, over both transports, on real sockets.

HTTP: a 4xx JSON ``{"error": {...}}``. WebSocket: an ``error`` event, the socket stays open, and
other lanes' responses are not cut off. Never a 5xx, a ``server_error`` or a close.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from responses_cache import SimulatedConfig, SimulatedEngine, create_app
from responses_cache.protocol.codec import MAX_DEPTH
from responses_cache.protocol.request import CreateResponse
from responses_cache.testing import LiveServer, serve_in_thread

TERMINAL = {"error", "response.completed", "response.failed", "response.incomplete"}
DEEP = 1_000


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=4)))
    live = serve_in_thread(app)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def ws(server: LiveServer) -> Iterator[ClientConnection]:
    with connect(server.ws_url, max_size=None, compression=None, open_timeout=10) as conn:
        yield conn


def _post(http: httpx.Client, body: bytes) -> httpx.Response:
    return http.post("/responses", content=body, headers={"content-type": "application/json"})


def _assert_envelope(response: httpx.Response, status: int | None = None) -> dict[str, Any]:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if status is not None:
        assert response.status_code == status, response.text[:300]
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/json")
        error = response.json()["error"]
        assert set(error) == {"type", "code", "message", "param"}
        assert error["type"] != "server_error"
        return dict(error)
    return {}


def _exchange(ws: ClientConnection, frame: str | bytes) -> list[dict[str, Any]]:
    """Send one frame; the events up to the terminal one (the socket must stay open)."""
    ws.send(frame if isinstance(frame, str) else frame.decode())
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(ws.recv(timeout=30))
        events.append(event)
        if event["type"] in TERMINAL:
            return events


def _assert_no_server_error(events: list[dict[str, Any]]) -> None:
    for event in events:
        if event["type"] == "error":
            assert event["status"] < 500 and event["error"]["type"] != "server_error", event
        if event["type"] == "response.failed":
            assert event["response"]["error"]["code"] != "server_error", event


def _normal_turn_works(http: httpx.Client, ws: ClientConnection) -> None:
    reply = _post(http, b'{"model":"sim-1","input":"hello"}')
    assert reply.status_code == 200 and reply.json()["status"] == "completed"
    events = _exchange(ws, '{"type":"response.create","model":"sim-1","input":"hello"}')
    assert events[-1]["type"] == "response.completed"


# -- the cases that were observed ----------------------------------------------------------------


@pytest.mark.parametrize("field", ["input", "tools", "unknown_field", "text", "metadata", "reasoning"])
def test_deep_nesting_is_a_400_on_http(http: httpx.Client, field: str) -> None:
    body = f'{{"model":"sim-1","{field}":{_nested(DEEP)}}}'
    error = _assert_envelope(_post(http, body.encode()), 400)
    assert error["code"] in ("invalid_json", "invalid_type", "invalid_value")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 500])
@pytest.mark.parametrize("where", ["text", "tool_parameters", "annotations"])
def test_free_form_values_deeper_than_the_limit_are_refused(http: httpx.Client, ws: ClientConnection, depth: int, where: str) -> None:
    value = json.loads(_nested(depth))
    body: dict[str, Any] = {"model": "sim-1", "input": "hi"}
    if where == "text":
        body["text"] = {"format": {"type": "text"}, "x": value}
    elif where == "tool_parameters":
        body["tools"] = [{"type": "function", "name": "f", "parameters": {"type": "object", "x": value}}]
    else:
        body["input"] = [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a", "annotations": value}]}
        ]
    error = _assert_envelope(_post(http, json.dumps(body).encode()), 400)
    assert error["code"] == "invalid_json" and "nested too deeply" in error["message"]
    events = _exchange(ws, json.dumps({"type": "response.create", **body}))
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "invalid_json"


def test_deep_nesting_over_websocket_does_not_cut_off_another_lane(server: LiveServer) -> None:
    slow = serve_in_thread(
        create_app(backend=SimulatedEngine(SimulatedConfig(output_tokens_per_s=400.0, answer_tokens=60)))
    )
    try:
        with connect(slow.ws_url, max_size=None) as conn:
            conn.send('{"type":"response.create","model":"sim-1","input":"long answer","stream_id":"a"}')
            first = json.loads(conn.recv(timeout=30))
            assert first["type"] == "response.created"
            for frame in (
                f'{{"type":"response.create","model":"sim-1","input":{_nested(DEEP)}}}',
                f'{{"type":"response.create","model":"sim-1","x":{_nested(DEEP)}}}',
                f'{{"type":"response.steer","x":{_nested(DEEP)}}}',
                f'{{"type":{_nested(DEEP)}}}',
            ):
                conn.send(frame)
            errors, lane_a = 0, []
            while not lane_a or lane_a[-1]["type"] not in TERMINAL:
                event = json.loads(conn.recv(timeout=30))
                if event.get("stream_id") == "a":
                    lane_a.append(event)
                else:
                    assert event["type"] == "error" and event["status"] == 400, event
                    errors += 1
            while errors < 4:
                event = json.loads(conn.recv(timeout=30))
                assert event["type"] == "error" and event["status"] == 400, event
                errors += 1
            assert lane_a[-1]["type"] == "response.completed"
    finally:
        slow.stop()


@pytest.mark.parametrize("tools", ["[1]", '["x"]', "[null]", "[[]]", "[true]", '[{"type":"function"}]', '{"a":1}'])
def test_tools_entries_that_are_not_tool_objects(http: httpx.Client, ws: ClientConnection, tools: str) -> None:
    body = f'{{"model":"sim-1","input":"hi","tools":{tools}}}'
    error = _assert_envelope(_post(http, body.encode()), 400)
    assert error["param"] is not None and error["param"].startswith("tools")
    events = _exchange(ws, '{"type":"response.create",' + body[1:])
    assert events[-1]["type"] == "error" and events[-1]["error"]["param"].startswith("tools")


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"sim-1","input":"\xff\xfe"}',
        b'{"model":"sim-1","input":[{"role":"user","content":"\xc3\x28"}]}',
        b'{"model":"sim-1","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"\xed\xa0\x80"}]}]}',
        b'{"model":"sim-1","input":"hi","tools":[{"type":"function","name":"\xff"}]}',
        b'{"model":"sim-\xff"}',
        b'{"model":"sim-1","input":"hi","instructions":"\xff"}',
        b'{"model":"sim-1","input":"\\ud800"}',
    ],
)
def test_invalid_utf8_inside_json_strings_is_a_400(http: httpx.Client, body: bytes) -> None:
    error = _assert_envelope(_post(http, body), 400)
    assert error["code"] == "invalid_json"


def test_lone_surrogate_escape_over_websocket(ws: ClientConnection) -> None:
    events = _exchange(ws, '{"type":"response.create","model":"sim-1","input":"\\ud800"}')
    assert events[-1]["type"] == "error" and events[-1]["status"] == 400


# -- arbitrary shapes and values for every field -------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20)
_json = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_FIELDS = sorted({*CreateResponse.__struct_fields__} - {"type"})
# Values shaped like the real thing as well, so the fuzzer gets past the first type check.
_item = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "x"])},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | _json,
        "content": st.text(max_size=10) | st.lists(
            st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "input_image", "refusal"])},
                                  optional={"text": _json, "annotations": _json, "image_url": _json}), max_size=3,
        ) | _json,
        "call_id": _json, "name": _json, "arguments": _json, "output": _json, "summary": _json,
    },
)
_tool = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "namespace", "web_search", ""]) | _json},
    optional={"name": _json, "parameters": _json, "tools": st.lists(_json, max_size=2), "strict": _json},
)
_special = {
    "input": st.text(max_size=20) | st.lists(_item, max_size=3) | _json,
    "tools": st.lists(_tool, max_size=3) | _json,
    "model": st.just("sim-1") | _json,
    "max_output_tokens": st.integers(-5, 2**40) | _json,
}
_bodies = st.dictionaries(
    st.sampled_from(_FIELDS), _json, max_size=6
).flatmap(
    lambda base: st.fixed_dictionaries({k: _special.get(k, _json) for k in base}).map(lambda b: {"model": "sim-1", **b})
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=_bodies)
def test_arbitrary_create_bodies_never_get_a_server_error(http: httpx.Client, ws: ClientConnection, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    _assert_envelope(_post(http, data))
    frame = json.dumps({**body, "type": "response.create"})
    _assert_no_server_error(_exchange(ws, frame))
    _normal_turn_works(http, ws)
