"""A raw ``websockets`` test client that validates every server event strictly.

The official SDK parses leniently (``construct_type_unchecked``), so every event received here is
checked with pydantic against ``ResponsesServerEvent`` (the WebSocket union) and, for response
stream events, against ``ResponseStreamEvent`` (the HTTP SSE union) as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, get_args

import pydantic
from openai._models import validate_type
from openai.types.responses import ResponsesServerEvent, ResponseStreamEvent
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

MODEL = "rec-1"
TERMINAL = ("response.completed", "response.failed", "response.incomplete")
ERROR_KEYS = {"type", "code", "message", "param"}

try:  # the default renderer, when the tokens package is there
    from responses_cache.tokens import get_renderer

    get_renderer("harmony")
    RENDERER: str | None = "harmony"
except (ImportError, AttributeError, KeyError, ValueError):
    RENDERER = None


def _by_type(union: Any) -> dict[str, Any]:
    members = get_args(get_args(union)[0])  # Annotated[Union[...], PropertyInfo(discriminator="type")]
    return {get_args(m.model_fields["type"].annotation)[0]: m for m in members}


#: The members of the SDK's unions by ``type``, to explain a failed validation readably.
WS_EVENTS = _by_type(ResponsesServerEvent)
SSE_EVENTS = _by_type(ResponseStreamEvent)


def _validate(union: Any, members: dict[str, Any], d: dict[str, Any]) -> None:
    """``validate_type`` (pydantic, strict about required fields and types) against the union."""
    assert d.get("type") in members, d
    try:
        validate_type(type_=union, value=d)
    except pydantic.ValidationError:
        members[d["type"]].model_validate(d)  # the same failure, without 60 members' worth of noise
        raise


def check_event(d: Any) -> None:
    """Strict validation of one server event (checklist items 8, 9, 34)."""
    assert isinstance(d, dict), d
    assert "event" not in d  # JSON only: no SSE ``event:`` line folded in
    kind = d.get("type")
    if kind == "response.steer.failed" and isinstance(d.get("error"), dict) and d["error"].get("code") == "invalid_input":
        # ``invalid_input`` returns the input exactly as sent, which the SDK's input type cannot
        # hold (it is invalid): validate everything else strictly.
        assert isinstance(d.get("steer"), dict) and "input" in d["steer"], d
        d = {**d, "steer": {**d["steer"], "input": "(as sent)"}}
    _validate(ResponsesServerEvent, WS_EVENTS, d)
    if kind == "error":
        assert isinstance(d.get("status"), int), d
        assert set(d["error"]) >= ERROR_KEYS, d
        assert isinstance(d["error"]["type"], str) and isinstance(d["error"]["message"], str), d
    elif kind.startswith("response.steer."):
        assert isinstance(d.get("sequence_number"), int), d
    else:
        _validate(ResponseStreamEvent, SSE_EVENTS, d)
        assert isinstance(d.get("sequence_number"), int), d
    if "stream_id" in d:
        assert isinstance(d["stream_id"], str) and d["stream_id"], d


def check_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Checks one response's events (in arrival order) and returns its terminal response.

    created first, ``sequence_number`` 0, 1, 2, … (items 9, 10), exactly one terminal event, last;
    one response id throughout; the lane's ``stream_id`` on every event or on none (items 23, 24).
    """
    assert events and events[0]["type"] == "response.created", [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert sum(k in TERMINAL for k in kinds) == 1 and kinds[-1] in TERMINAL, kinds
    assert "error" not in kinds
    lanes = {e.get("stream_id") for e in events}
    assert len(lanes) == 1, lanes
    ids = {e["response"]["id"] for e in events if "response" in e}
    assert len(ids) == 1, ids
    return events[-1]["response"]


class WS:
    """One connection. ``log`` keeps every event received, in order."""

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn
        self.log: list[dict[str, Any]] = []

    async def send(self, payload: dict[str, Any] | str) -> None:
        await self.conn.send(payload if isinstance(payload, str) else json.dumps(payload))

    async def create(self, **body: Any) -> None:
        body.setdefault("model", MODEL)
        await self.send({"type": "response.create", **body})

    async def recv(self) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.conn.recv(), 15)
        assert isinstance(raw, str), "server sent a binary frame"
        d = json.loads(raw)
        check_event(d)
        self.log.append(d)
        return d

    async def recv_until(self, predicate: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Events up to and including the first one matching ``predicate``."""
        out: list[dict[str, Any]] = []
        while True:
            d = await self.recv()
            out.append(d)
            if predicate(d):
                return out

    async def finish(self, lane: Any = None) -> list[dict[str, Any]]:
        """Events (all lanes) until the next terminal or ``error`` event of ``lane``, or an
        ``error`` without a lane (the answer to an invalid ``stream_id`` or frame)."""

        def done(d: dict[str, Any]) -> bool:
            if d["type"] == "error" and "stream_id" not in d:
                return True
            return d.get("stream_id") == lane and (d["type"] in TERMINAL or d["type"] == "error")

        return await self.recv_until(done)

    async def turn(self, **body: Any) -> list[dict[str, Any]]:
        """Send one create and return its events (no other lane may be streaming meanwhile)."""
        await self.create(**body)
        return await self.finish(body.get("stream_id"))

    async def ok(self, **body: Any) -> dict[str, Any]:
        """A turn that must complete; returns the completed response."""
        events = await self.turn(**body)
        response = check_stream(events)
        assert response["status"] == "completed", response
        return response

    async def error(self, **body: Any) -> dict[str, Any]:
        """A create that must be answered by one ``error`` event (and nothing else)."""
        events = await self.turn(**body)
        assert [e["type"] for e in events] == ["error"], [e["type"] for e in events]
        return events[0]

    async def closed(self) -> tuple[int | None, list[dict[str, Any]]]:
        """Read until the server closes; returns (close code, events received meanwhile). Only
        the close ends the reading: a malformed event, a binary frame or a server that does not
        close (within the receive timeout) fails the caller."""
        events: list[dict[str, Any]] = []
        with contextlib.suppress(ConnectionClosed):
            while True:
                events.append(await self.recv())
        await asyncio.wait_for(self.conn.wait_closed(), 15)
        return self.conn.close_code, events


@contextlib.asynccontextmanager
async def ws_connect(url: str, **options: Any) -> AsyncIterator[WS]:
    options.setdefault("max_size", None)
    options.setdefault("compression", None)
    async with connect(url, **options) as conn:
        yield WS(conn)


def lane_events(events: list[dict[str, Any]], lane: str | None) -> list[dict[str, Any]]:
    return [e for e in events if e.get("stream_id") == lane]


def split_responses(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split one lane's events into per-response streams (a lane never overlaps itself)."""
    out: list[list[dict[str, Any]]] = []
    for e in events:
        if e["type"] == "error":
            continue
        if e["type"] == "response.created":
            out.append([])
        out[-1].append(e)
    return out


def items_sent(*inputs: Any) -> list[dict[str, Any]]:
    """Flatten request inputs (a string is one user message) into input items."""
    out: list[dict[str, Any]] = []
    for value in inputs:
        if isinstance(value, str):
            out.append({"type": "message", "role": "user", "content": value})
        else:
            out.extend(value)
    return out


def function_tool(name: str = "run") -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": "Run a step.",
        "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]},
    }


def recv_until(ws: Any, kind: str, timeout: float = 60) -> dict[str, Any]:
    """The next event of type ``kind`` on a ``websockets.sync`` connection, every event up to it
    validated strictly. An ``error`` or ``response.failed`` before it fails the test, and so do
    ``timeout`` seconds without a frame (naming the last types received)."""
    seen: list[str] = []
    while True:
        try:
            event = json.loads(ws.recv(timeout=timeout))
        except TimeoutError:
            raise AssertionError(f"no {kind} within {timeout:g} s; received: {seen[-12:]}") from None
        check_event(event)
        if event["type"] == kind:
            return dict(event)
        assert event["type"] not in ("error", "response.failed"), event
        seen.append(event["type"])


def completed_turn(ws: Any, body: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
    """One ``response.create`` on a ``websockets.sync`` connection: the response of its
    ``response.completed`` (anything else ending the turn fails the test)."""
    ws.send(json.dumps({"type": "response.create", **body}))
    while True:
        event = json.loads(ws.recv(timeout=timeout))
        if event["type"] in ("response.completed", "response.failed", "error"):
            assert event["type"] == "response.completed", event
            return dict(event["response"])
