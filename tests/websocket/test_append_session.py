"""Unit tests of ``response.append`` in the sans-I/O :class:`Session` and of the
:class:`AppendChannel` between it and the pipeline: no sockets, no server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from test_session import create, drained

from responses_cache.pipeline.append import AppendChannel
from responses_cache.protocol.items import FunctionCallOutput
from responses_cache.session.session import PendingTurn, Session, SessionConfig


def append(response_id: Any, *call_ids: str, **extra: Any) -> str:
    items = [{"type": "function_call_output", "call_id": c, "output": "ok"} for c in call_ids]
    return json.dumps({"type": "response.append", "response_id": response_id, "input": items, **extra})


def started(session: Session, lane: str | None = None) -> tuple[PendingTurn, AppendChannel]:
    session.receive(create(append=True, stream_id=lane) if lane else create(append=True))
    (pending,) = session.startable()
    session.activate(pending, "resp_1", True)
    channel = session.appendable(pending)
    assert channel is not None
    return pending, channel


def codes(session: Session) -> list[tuple[str, str | None, str | None]]:
    out = []
    for d in drained(session):
        assert d["type"] == "error" and d["status"] == 400 and d["error"]["type"] == "invalid_request_error", d
        out.append((d["error"]["code"], d["error"]["param"], d.get("stream_id")))
    return out


def test_off_by_default_append_is_refused_and_the_legacy_event_ignored() -> None:
    session = Session("t")
    assert SessionConfig().allow_append is False
    session.receive(create(append=True))
    assert codes(session) == [("append_not_enabled", "append", None)]
    assert session.startable() == [] and session.queued_bytes == 0
    session.receive(append("resp_1", "call_1"))
    assert session.drain() == []  # the Jan 2026 precursor event: silently ignored
    session.receive(create())
    (pending,) = session.startable()
    assert session.appendable(pending) is None


def test_outputs_are_handed_over_only_when_they_answer_the_pending_calls() -> None:
    session = Session("t", SessionConfig(allow_append=True))
    pending, channel = started(session, "lane")
    session.receive(append("resp_1", "call_1"))  # still generating
    assert codes(session) == [("response_not_awaiting_input", "response_id", "lane")]
    channel.pending = ("call_1", "call_2")  # what the pipeline sets when it awaits input
    for frame, want in (
        (append("resp_1", "call_1"), ("invalid_append_input", "input", "lane")),
        (append("resp_1", "call_1", "call_3"), ("invalid_append_input", "input[1].call_id", "lane")),
        (append("resp_1", "call_1", "call_1"), ("invalid_append_input", "input[1].call_id", "lane")),
        (json.dumps({"type": "response.append", "response_id": "resp_1", "input": [{"role": "user", "content": "x"}]}),
         ("invalid_append_input", "input[0]", "lane")),
        (append("resp_2", "call_1", "call_2"), ("response_not_awaiting_input", "response_id", None)),
        (append(None, "call_1"), ("missing_required_parameter", "response_id", None)),
        (append(7, "call_1"), ("invalid_type", "response_id", None)),
    ):
        session.receive(frame)
        assert codes(session) == [want], frame
        assert channel.pending == ("call_1", "call_2")
    session.receive(append("resp_1", "call_2", "call_1"))  # any order
    assert session.drain() == []
    assert channel.pending == () and channel.appends == 1
    session.receive(append("resp_1", "call_1", "call_2"))  # delivered: no longer awaiting
    assert codes(session) == [("response_not_awaiting_input", "response_id", "lane")]
    session.finished(pending, None)
    channel.pending = ("call_1",)
    session.receive(append("resp_1", "call_1"))  # the response ended: unknown from now on
    assert codes(session) == [("response_not_awaiting_input", "response_id", None)]


def test_close_drops_the_open_responses() -> None:
    session = Session("t", SessionConfig(allow_append=True))
    _, channel = started(session)
    channel.pending = ("call_1",)
    session.close()
    session.receive(append("resp_1", "call_1"))
    assert codes(session) == [("response_not_awaiting_input", "response_id", None)]


async def test_the_channel_hands_the_outputs_to_the_waiting_pipeline() -> None:
    channel = AppendChannel()
    waiter = asyncio.ensure_future(channel.wait(("call_1",)))
    await asyncio.sleep(0)
    assert channel.awaiting and channel.pending == ("call_1",)
    item = FunctionCallOutput(call_id="call_1", output="ok")
    channel.deliver([item])
    assert await waiter == [item]
    # A cancelled wait (the client left) leaves nothing awaited.
    waiter = asyncio.ensure_future(channel.wait(("call_2",)))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not channel.awaiting
