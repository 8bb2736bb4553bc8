"""Unit tests of the sans-I/O :class:`Session`: no sockets, no tasks, no clock but ``tick(now)``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import msgspec
import pytest
from wsclient import check_event

from responses_cache.conversation import EMPTY
from responses_cache.protocol.codec import encode
from responses_cache.protocol.errors import server_error
from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Message,
    OutputText,
)
from responses_cache.protocol.request import decode_create
from responses_cache.protocol.response import Response
from responses_cache.protocol.tools import EMPTY_TOOLS, parse_tools
from responses_cache.session.session import PendingTurn, Session, SessionConfig
from responses_cache.storage.state import ResponseState
from responses_cache.tokens.key import reusable_prefix

DOCUMENTED_LIMIT = (
    "Responses websocket connection limit reached (60 minutes). Create a new websocket connection to continue."
)


def create(**body: Any) -> str:
    body.setdefault("model", "m")
    return json.dumps({"type": "response.create", **body})


def drained(session: Session) -> list[dict[str, Any]]:
    out = [json.loads(encode(e)) for e in session.drain()]
    for d in out:
        check_event(d)
    return out


def errors(session: Session) -> list[tuple[str | None, str | None]]:
    """(code, stream_id) of each drained error event."""
    out = []
    for d in drained(session):
        assert d["type"] == "error"
        out.append((d["error"]["code"], d.get("stream_id")))
    return out


def state(
    rid: str,
    lane: str | None = None,
    items: tuple[Any, ...] = (),
    *,
    status: str = "completed",
    instructions: str | None = None,
    tools: Any = EMPTY_TOOLS,
    nbytes: int = 0,
) -> ResponseState:
    response = Response(
        id=rid, created_at=0, status=status, model="m", output=[], tools=[], tool_choice="auto",  # type: ignore[arg-type]
        parallel_tool_calls=True,
    )
    return ResponseState(
        response=response, tenant="t", lane=lane, conversation=EMPTY.extend(list(items)), instructions=instructions,
        tools=tools, fingerprint=None, token_log=None, route=None, total_bytes=nbytes,
    )


def start(session: Session) -> list[PendingTurn]:
    return session.startable()


def lanes(turns: list[PendingTurn]) -> list[str | None]:
    return [t.lane for t in turns]


# -- lanes, FIFO, cap -------------------------------------------------------------------------------


def test_lanes_run_fifo_one_at_a_time() -> None:
    s = Session("t")
    for tag in ("d1", "d2", "d3"):
        s.receive(create(metadata={"tag": tag}))
    for tag in ("a1", "a2"):
        s.receive(create(stream_id="a", metadata={"tag": tag}))
    first = start(s)
    assert [t.request.metadata for t in first] == [{"tag": "d1"}, {"tag": "a1"}]
    assert start(s) == []  # both lanes busy
    s.finished(first[1], state("r_a1", "a"))
    (nxt,) = start(s)
    assert nxt.request.metadata == {"tag": "a2"}
    s.finished(first[0], state("r_d1"))
    (nxt,) = start(s)
    assert nxt.request.metadata == {"tag": "d2"}
    assert drained(s) == []


def test_in_flight_cap_queues_instead_of_rejecting() -> None:
    s = Session("t")
    s.receive(create(metadata={"tag": "default"}))
    for i in range(19):
        s.receive(create(stream_id=f"l{i}"))
    running = start(s)
    assert len(running) == 16 and s.in_flight == 16
    assert lanes(running) == [None, *[f"l{i}" for i in range(15)]]
    assert start(s) == [] and drained(s) == []  # queued, not rejected
    s.finished(running[3], state("r3", running[3].lane))
    assert lanes(start(s)) == ["l15"]  # FIFO across lanes too
    for turn in running[:2]:
        s.finished(turn, None)
    assert lanes(start(s)) == ["l16", "l17"]
    assert s.in_flight == 16


def test_a_queued_turn_behind_a_busy_lane_does_not_block_other_lanes() -> None:
    s = Session("t", SessionConfig(max_in_flight=2))
    s.receive(create(stream_id="a"))
    s.receive(create(stream_id="a"))
    s.receive(create(stream_id="b"))
    assert lanes(start(s)) == ["a", "b"]


def test_32_named_lanes_then_stream_limit_reached() -> None:
    s = Session("t")
    for i in range(32):
        s.receive(create(stream_id=f"lane_{i}"))
    s.receive(create())  # the default lane does not count
    assert drained(s) == []
    s.receive(create(stream_id="lane_32"))
    (err,) = drained(s)
    assert err["status"] == 400 and err["stream_id"] == "lane_32"
    assert err["error"] == {
        "type": "invalid_request_error",
        "code": "websocket_stream_limit_reached",
        "message": "This WebSocket connection has reached its maximum number of distinct stream IDs (32). "
        "Reuse an existing stream_id or open a new WebSocket connection.",
        "param": "stream_id",
    }
    s.receive(create(stream_id="lane_7"))  # existing lanes keep working
    assert drained(s) == []
    assert len(s._waiting) == 34


@pytest.mark.parametrize(
    "stream_id", ["", "a" * 257, "has space", "slash/no", "ünï", "tab\t", "newline\n", 5, ["x"], {"a": 1}, True]
)
def test_invalid_stream_id(stream_id: Any) -> None:
    s = Session("t")
    s.receive(create(stream_id=stream_id))
    (err,) = drained(s)
    assert "stream_id" not in err
    assert err["status"] == 400
    assert err["error"]["code"] == "invalid_stream_id" and err["error"]["param"] == "stream_id"
    assert err["error"]["type"] == "invalid_request_error"
    assert start(s) == []


@pytest.mark.parametrize("stream_id", ["a" * 256, "A-z_0.9", "x"])
def test_valid_stream_ids(stream_id: str) -> None:
    s = Session("t")
    s.receive(create(stream_id=stream_id))
    assert drained(s) == [] and lanes(start(s)) == [stream_id]


def test_null_stream_id_is_the_default_lane() -> None:
    s = Session("t")
    s.receive(create(stream_id=None))
    assert drained(s) == [] and lanes(start(s)) == [None]


# -- client events ----------------------------------------------------------------------------------


def test_response_processed_is_ignored() -> None:
    s = Session("t")
    s.receive(json.dumps({"type": "response.processed", "response_id": "resp_1"}))
    s.receive(json.dumps({"type": "response.processed"}))
    assert drained(s) == [] and start(s) == []


@pytest.mark.parametrize(
    ("frame", "param", "code"),
    [
        ("not json", None, "invalid_json"),
        ("[1, 2]", None, "invalid_json"),
        ('"response.create"', None, "invalid_json"),
        ("{", None, "invalid_json"),
        ("{}", "type", "missing_required_parameter"),
        ('{"type": "response.cancel"}', "type", "invalid_value"),
        ('{"type": "session.update"}', "type", "invalid_value"),
        ('{"type": null}', "type", "missing_required_parameter"),
        ('{"type": 7}', "type", "invalid_type"),
        ('{"type": ["response.create"]}', "type", "invalid_type"),
        ('{"type": {"a": 1}}', "type", "invalid_type"),
    ],
)
def test_bad_frames_get_an_error_event(frame: str, param: str | None, code: str) -> None:
    s = Session("t")
    s.receive(frame)
    (err,) = drained(s)
    assert err["status"] == 400
    assert err["error"]["param"] == param and err["error"]["code"] == code
    assert start(s) == [] and s.close_code is None
    s.receive(create())  # the session keeps going
    assert lanes(start(s)) == [None]


def test_background_true_is_rejected() -> None:
    s = Session("t")
    s.receive(create(background=True, stream_id="bg"))
    (err,) = drained(s)
    assert err["status"] == 400 and err["stream_id"] == "bg"
    assert err["error"]["param"] == "background" and err["error"]["type"] == "invalid_request_error"
    assert start(s) == []
    s.receive(create(background=False, stream=True))
    s.receive(create(stream=False, stream_id="bg"))
    assert drained(s) == [] and lanes(start(s)) == [None, "bg"]


def test_invalid_create_body_is_a_lane_scoped_error() -> None:
    s = Session("t")
    s.receive(json.dumps({"type": "response.create", "stream_id": "x", "input": "hi"}))
    s.receive(create(stream_id="y", temperature="hot"))
    assert errors(s) == [("missing_required_parameter", "x"), ("invalid_type", "y")]
    assert start(s) == []


def test_too_many_queued_creates_are_rate_limited() -> None:
    s = Session("t", SessionConfig(max_queued=3))
    for _ in range(4):
        s.receive(create())
    (err,) = drained(s)
    assert err["status"] == 429 and err["error"]["code"] == "rate_limit_exceeded"


# -- lifetime ---------------------------------------------------------------------------------------


def test_documented_limit_message() -> None:
    assert SessionConfig().limit_message.format(minutes=60) == DOCUMENTED_LIMIT


def test_expiry_when_idle_errors_then_closes() -> None:
    s = Session("t", now=100.0)
    s.tick(100.0 + 3599.0)
    assert drained(s) == [] and s.close_code is None and not s.expired
    s.tick(100.0 + 3600.0)
    (err,) = drained(s)
    assert err["status"] == 400 and "stream_id" not in err
    assert err["error"] == {
        "type": "invalid_request_error",
        "code": "websocket_connection_limit_reached",
        "message": DOCUMENTED_LIMIT,
        "param": None,
    }
    assert s.close_code == 1000
    s.tick(100.0 + 3700.0)
    assert drained(s) == []  # once


def test_expiry_finishes_in_flight_work_refuses_the_rest_then_closes() -> None:
    s = Session("t", SessionConfig(lifetime_s=10.0), now=0.0)
    s.receive(create(stream_id="a"))
    s.receive(create(stream_id="a"))  # queued behind the first
    (running,) = start(s)
    s.tick(10.0)
    assert s.expired and s.close_code is None  # in flight: finish it first
    assert errors(s) == [("websocket_connection_limit_reached", "a")]  # the queued one is refused
    s.receive(create(stream_id="b"))
    s.receive(create(stream_id="a"))
    s.receive(create())
    assert errors(s) == [
        ("websocket_connection_limit_reached", "b"),
        ("websocket_connection_limit_reached", "a"),
        ("websocket_connection_limit_reached", None),
    ]
    assert start(s) == []
    s.finished(running, state("r1", "a"))
    s.tick(10.5)
    assert s.close_code == 1000
    assert drained(s) == []  # the refusals already told the client; no duplicate


def test_expiry_with_work_in_flight_and_no_refusals_sends_the_error_at_close() -> None:
    s = Session("t", SessionConfig(lifetime_s=10.0), now=0.0)
    s.receive(create())
    (running,) = start(s)
    s.tick(11.0)
    assert drained(s) == [] and s.close_code is None
    s.finished(running, state("r1"))
    s.tick(11.0)
    assert errors(s) == [("websocket_connection_limit_reached", None)] and s.close_code == 1000


# -- cache and eviction -----------------------------------------------------------------------------


def pending(s: Session, **body: Any) -> PendingTurn:
    s.receive(create(**body))
    assert drained(s) == []
    (turn,) = start(s)
    return turn


def test_resolve_hits_each_lanes_latest_only() -> None:
    s = Session("t", SessionConfig(superseded_keep=0))
    s.finished(pending(s), state("r1"))
    s.finished(pending(s, previous_response_id="r1"), state("r2"))
    s.finished(pending(s, stream_id="b", previous_response_id="r2"), state("r3", "b"))
    # two hits (neither superseded), one miss; hits and misses are counted in Metrics by the
    # service (tests/websocket/test_sdk.py, test_resend_fidelity.py), from what resolve returns
    assert s.find_cached_parent(pending(s, previous_response_id="r2")) == (s.cache.latest[None], False)
    assert s.find_cached_parent(pending(s, stream_id="b", previous_response_id="r3")) == (s.cache.latest["b"], False)
    assert s.find_cached_parent(pending(s, stream_id="c", previous_response_id="r1")) is None  # replaced on its lane
    assert s.find_cached_parent(pending(s, stream_id="d")) is None  # nothing wanted


def test_superseded_responses_stay_findable_for_a_bounded_grace_period() -> None:
    """A fork sent while its parent's lane moved on still finds the parent: for
    ``superseded_grace_s`` (the caller's clock) and among the last ``superseded_keep`` only."""
    s = Session("t", SessionConfig(superseded_keep=2, superseded_grace_s=5.0))
    s.finished(pending(s, stream_id="a"), state("r1", "a"), now=100.0)
    s.finished(pending(s, stream_id="a", previous_response_id="r1"), state("r2", "a"), now=101.0)
    found = s.find_cached_parent(pending(s, stream_id="b", previous_response_id="r1"), now=102.0)
    assert found is not None and found[0].id == "r1" and found[1] is True  # a grace hit
    assert s.find_cached_parent(pending(s, stream_id="c", previous_response_id="r1"), now=106.0) is None  # expired
    # count-bounded: only the last two superseded responses are kept
    for k in range(3, 7):
        s.finished(pending(s, stream_id="a"), state(f"r{k}", "a"), now=110.0)
    assert [st.id for _, st, _ in s.cache.superseded] == ["r4", "r5"]
    assert s.cache.find("r3", 110.0) is None and s.cache.find("r5", 110.0) is not None
    # they do not count against the budget, and they are the first to go when it is exceeded
    assert s.cache.size()[0] == 0
    big = Session("t", SessionConfig(max_cached_items=3))
    msg = Message(role="user", content="hi")
    x1 = state("x1", "a", (msg,))
    big.finished(pending(big, stream_id="a"), x1)
    big.finished(pending(big, stream_id="a"), dataclasses.replace(state("x2", "a"), conversation=x1.conversation.extend([msg])))
    assert big.cache.find("x1") is not None  # x2 continues x1: x1 is kept
    big.finished(pending(big, stream_id="b"), state("y1", "b", (msg, msg)))
    assert big.cache.find("x1") is None and list(big.cache.superseded) == []
    # only a response its successor continues is kept (an unrelated one would cost its whole history)
    big.finished(pending(big, stream_id="b"), state("y2", "b", (msg,)))
    assert big.cache.find("y1") is None
    # a failed same-lane continuation from a superseded response evicts it too
    s2 = Session("t")
    s2.finished(pending(s2, stream_id="a"), state("p1", "a"))
    s2.finished(pending(s2, stream_id="a"), state("p2", "a"))
    s2.finished(pending(s2, stream_id="a", previous_response_id="p1"), None)
    assert s2.cache.find("p1") is None and s2.cache.find("p2") is not None


def test_same_lane_failure_evicts_the_parent() -> None:
    s = Session("t")
    s.finished(pending(s, stream_id="a"), state("r1", "a"))
    s.finished(pending(s, stream_id="a", previous_response_id="r1"), None)  # e.g. a 4xx
    assert s.cache.find("r1") is None
    s.finished(pending(s), state("r2"))
    s.finished(pending(s, previous_response_id="r2"), state("r3", status="failed"))  # response.failed
    assert s.cache.find("r2") is None and s.cache.find("r3") is None


def test_cross_lane_fork_failure_keeps_the_shared_parent() -> None:
    s = Session("t")
    s.finished(pending(s, stream_id="a"), state("r1", "a"))
    s.finished(pending(s, stream_id="b", previous_response_id="r1"), None)
    s.finished(pending(s, stream_id="c", previous_response_id="r1"), state("r2", "c", status="failed"))
    assert s.cache.find("r1") == ("a", s.cache.latest["a"])
    assert s.find_cached_parent(pending(s, stream_id="a", previous_response_id="r1")) is not None


def test_failures_without_a_cached_parent_change_nothing() -> None:
    s = Session("t")
    s.finished(pending(s, stream_id="a"), state("r1", "a"))
    s.finished(pending(s, stream_id="a"), None)  # a fresh chain failed
    s.finished(pending(s, stream_id="a", previous_response_id="gone"), None)  # a miss failed
    assert s.cache.find("r1") is not None


def test_incomplete_responses_are_cached() -> None:
    s = Session("t")
    s.finished(pending(s), state("r1", status="incomplete"))
    assert s.cache.find("r1") is not None


def test_budget_evicts_least_recently_updated_lanes() -> None:
    msg = Message(role="user", content="hi")
    s = Session("t", SessionConfig(max_cached_items=5))
    s.finished(pending(s, stream_id="a"), state("ra", "a", (msg, msg)))
    s.finished(pending(s, stream_id="b"), state("rb", "b", (msg, msg)))
    s.finished(pending(s, stream_id="a"), state("ra2", "a", (msg,)))  # a is now the most recent
    assert set(s.cache.latest) == {"a", "b"}
    s.finished(pending(s, stream_id="c"), state("rc", "c", (msg, msg, msg)))
    assert set(s.cache.latest) == {"a", "c"}  # over budget: b was least recently updated
    s = Session("t", SessionConfig(max_cached_bytes=1000))
    s.finished(pending(s, stream_id="a"), state("ra", "a", nbytes=600))
    s.finished(pending(s, stream_id="b"), state("rb", "b", nbytes=600))
    assert set(s.cache.latest) == {"b"}
    s.finished(pending(s, stream_id="c"), state("rc", "c", nbytes=5000))  # alone over budget
    assert s.cache.latest == {}


# -- full-input matching ----------------------------------------------------------------------------


def test_full_input_matches_the_lanes_cached_conversation() -> None:
    history = (
        Message(role="user", content="hi"),
        FunctionCall(call_id="c1", name="run", arguments="{}", id="fc_1", status="completed"),
        FunctionCallOutput(call_id="c1", output="done"),
        Message(role="assistant", content=[OutputText(text="ok")], id="msg_1", status="completed"),
    )
    tools = parse_tools(msgspec.json.encode([{"type": "function", "name": "run"}]))
    s = Session("t")
    s.finished(pending(s, stream_id="a"), state("r1", "a", history, instructions="be brief", tools=tools))
    cached = s.cache.latest["a"]
    resent = [
        Message(role="user", content=[InputText(text="hi")]),
        FunctionCall(call_id="c1", name="run", arguments="{}"),  # no id/status: still the same item
        FunctionCallOutput(call_id="c1", output="done"),
        Message(role="assistant", content=[OutputText(text="ok")]),
        Message(role="user", content="more"),
    ]
    turn = PendingTurn(decode_create(create(stream_id="a", instructions="be brief")), "a", 99)

    def match(items: list[Any], fingerprint: bytes = tools.fingerprint, t: PendingTurn = turn) -> tuple[list[Any], int] | None:
        found = s.match_full_input(t, items, fingerprint, None)
        return None if found is None else (found[0].conversation.items(), found[1])

    # render-equal items match; the parent then holds the client's items, not the cached shapes
    assert match(resent) == (resent[:4], 4)
    assert match(resent[:4]) == (resent[:4], 4)
    # the very same items: the cached state itself is the parent (shared, hooks' state kept)
    assert s.match_full_input(turn, [*history, resent[4]], tools.fingerprint, None) == (cached, 4)
    assert match(resent[:3]) == (resent[:3], 3)  # shorter than the cache: cut there
    changed = [*resent[:2], FunctionCallOutput(call_id="c1", output="other"), *resent[3:]]
    assert match(changed) == (resent[:2], 2)  # the match stops where the items differ
    found = s.match_full_input(turn, changed, tools.fingerprint, None)
    assert found is not None and found[0].open_calls == {"c1": "run"} and found[0].hook_state == {}
    phased = [*resent[:3], Message(role="assistant", content=[OutputText(text="ok")], phase="commentary")]
    assert match(phased) == (resent[:3], 3)  # phase is rendered
    split = [Message(role="user", content=[InputText(text="h"), InputText(text="i")]), *resent[1:]]
    assert match(split) is None  # part boundaries are rendered: nothing to reuse
    # after a turn from the rebased parent, the cache holds the client's shapes: the next resend of
    # the same prefix is identical again (no render keys built for it)
    found = s.match_full_input(turn, resent, tools.fingerprint, None)
    assert found is not None
    answer = Message(role="assistant", content=[OutputText(text="sure")], id="msg_2", status="completed")
    child = dataclasses.replace(found[0], conversation=found[0].conversation.extend([resent[4], answer]))
    assert reusable_prefix(child.conversation.items(), [*resent, answer], None) == (6, 6)
    assert reusable_prefix(child.conversation.items(), [*resent, Message(role="assistant", content="sure")], None) == (6, 5)
    assert match(resent, EMPTY_TOOLS.fingerprint) is None  # other tools
    other_instructions = PendingTurn(decode_create(create(instructions="x")), "a", 100)
    assert match(resent, t=other_instructions) is None
    other_lane = PendingTurn(decode_create(create(instructions="be brief")), "b", 101)
    assert match(resent, t=other_lane) is None
    s.cache.put("f", state("rf", "f", history, status="failed"))
    failed_lane = PendingTurn(decode_create(create()), "f", 102)
    assert match(resent, EMPTY_TOOLS.fingerprint, failed_lane) is None


# -- close ------------------------------------------------------------------------------------------


def test_close_drops_all_connection_state() -> None:
    s = Session("t")
    s.finished(pending(s, stream_id="a"), state("r1", "a"))
    s.receive(create(stream_id="a"))
    s.receive(create(stream_id="a"))
    start(s)
    s.receive("junk")
    s.close()
    assert s.cache.latest == {} and s.drain() == [] and start(s) == []
    assert s.cache.find("r1") is None


def test_error_helpers_carry_the_lane() -> None:
    s = Session("t")
    turn = pending(s, stream_id="z", previous_response_id="resp_x")
    s.not_found(turn)
    s.error(server_error(), "z")
    out = drained(s)
    assert [(d["status"], d["error"]["code"], d["stream_id"]) for d in out] == [
        (400, "previous_response_not_found", "z"),
        (500, "server_error", "z"),
    ]
    assert out[0]["error"]["message"] == "Previous response with id 'resp_x' not found."
