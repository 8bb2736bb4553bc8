"""Unit tests of steering in the sans-I/O :class:`Session` (and :mod:`responses_cache.session.steering`):
every code path and event shape, with no socket, task or clock."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsclient import check_event

from responses_cache.conversation import EMPTY
from responses_cache.edge.bridge import bridge_service
from responses_cache.protocol.codec import encode
from responses_cache.protocol.errors import invalid_request
from responses_cache.protocol.items import CustomToolCall, FunctionCall, Item, Message
from responses_cache.protocol.request import decode_input
from responses_cache.protocol.response import Response
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.session.session import PendingTurn, Session, SessionConfig
from responses_cache.storage.state import ResponseState, open_calls_after

STEER_ID = re.compile(r"steer_[0-9a-f]{32}")
SUCCESSOR_FAILED = "We couldn't start the next response. Send this steering input again with response.create."


def create(**body: Any) -> str:
    body.setdefault("model", "m")
    return json.dumps({"type": "response.create", **body})


def steer(target: Any, value: Any = "shorter", **extra: Any) -> str:
    return json.dumps({"type": "response.steer", "previous_response_id": target, "input": value, **extra})


def drained(s: Session) -> list[dict[str, Any]]:
    out = [json.loads(encode(e)) for e in s.drain()]
    for d in out:
        check_event(d)
    return out


def running(s: Session, rid: str = "resp_t", *, supported: bool = True, **body: Any) -> PendingTurn:
    """A turn started and activated as ``rid``."""
    s.receive(create(**body))
    (turn,) = s.startable()
    s.activate(turn, rid, supported)
    return turn


def ended(rid: str, lane: str | None = None, output: list[Item] | None = None, status: str = "completed") -> ResponseState:
    output = output or [Message(role="assistant", content="partial")]
    response = Response(
        id=rid, created_at=0, status=status, model="m", output=list(output), tools=[], tool_choice="auto",  # type: ignore[arg-type]
        parallel_tool_calls=True,
    )
    return ResponseState(
        response=response, tenant="t", lane=lane, conversation=EMPTY.extend([Message(role="user", content="q"), *output]),
        instructions=None, tools=EMPTY_TOOLS, fingerprint=None, token_log=None, route=None,
        open_calls=open_calls_after({}, output),
    )


def input_of(turn: PendingTurn) -> list[Any]:
    return [json.loads(msgspec.json.encode(i)) for i in decode_input(turn.request.input)]


def text_inputs(turn: PendingTurn) -> list[str]:
    return [i.content if isinstance(i.content, str) else i.content[0].text  # type: ignore[union-attr]
            for i in decode_input(turn.request.input) if isinstance(i, Message)]


# -- accepted ----------------------------------------------------------------------------------------


def test_accepted_shape_id_and_interrupt() -> None:
    s = Session("t")
    turn = running(s, stream_id="agent")
    interrupt = s.steering.active["resp_t"].interrupt
    assert interrupt is not None and not interrupt.requested
    s.receive(steer("resp_t"))
    (accepted,) = drained(s)
    assert set(accepted) == {"type", "sequence_number", "steer", "stream_id"}
    assert accepted["type"] == "response.steer.accepted" and accepted["stream_id"] == "agent"
    assert accepted["sequence_number"] == 0
    assert set(accepted["steer"]) == {"id", "previous_response_id"} and accepted["steer"]["previous_response_id"] == "resp_t"
    assert STEER_ID.fullmatch(accepted["steer"]["id"])
    assert interrupt.requested and not interrupt.taken
    assert turn.response_id == "resp_t" and s.steering.accepted == 1


def test_steering_events_are_numbered_per_connection() -> None:
    s = Session("t")
    running(s)
    for _ in range(3):
        s.receive(steer("resp_t"))
    s.receive(steer("resp_unknown"))
    assert [d["sequence_number"] for d in drained(s)] == [0, 1, 2, 3]


# -- invalid_input -------------------------------------------------------------------------------------


INVALID: list[tuple[Any, dict[str, Any]]] = [
    ("x", {"stream_id": "agent"}),
    ("x", {"extra": 1}),
    ([{"role": "assistant", "content": "x"}], {}),
    ([{"role": "developer", "content": "x"}], {}),
    ([{"content": "x"}], {}),
    ([{"type": "function_call_output", "call_id": "c", "output": "x"}], {}),
    ([{"type": "item_reference", "id": "msg_1"}], {}),
    ([{"role": "user", "content": "x", "status": "completed"}], {}),
    ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}], {}),
    ([{"role": "user", "content": [{"type": "input_text"}]}], {}),
    ([{"role": "user", "content": 5}], {}),
    (["x"], {}),
    ([], {}),
    ("", {}),
    (None, {}),
    ({"role": "user", "content": "x"}, {}),
]


@pytest.mark.parametrize(("value", "extra"), INVALID)
def test_invalid_input(value: Any, extra: dict[str, Any]) -> None:
    s = Session("t")
    running(s, stream_id="agent")
    s.receive(steer("resp_t", value, **extra))
    (failed,) = drained(s)
    assert set(failed) == {"type", "sequence_number", "steer", "error", "stream_id"} and failed["stream_id"] == "agent"
    assert failed["steer"] == {"previous_response_id": "resp_t", "input": value}  # no id: none was allocated
    assert set(failed["error"]) == {"type", "code", "message"}
    assert failed["error"]["type"] == "invalid_request_error" and failed["error"]["code"] == "invalid_input"
    interrupt = s.steering.active["resp_t"].interrupt
    assert interrupt is not None and not interrupt.requested and s.steering.active["resp_t"].steers == []


def test_missing_target_is_invalid_input() -> None:
    s = Session("t")
    s.receive(json.dumps({"type": "response.steer", "input": "x"}))
    s.receive(json.dumps({"type": "response.steer"}))
    first, second = drained(s)
    assert first["steer"] == {"previous_response_id": "", "input": "x"} and first["error"]["code"] == "invalid_input"
    assert second["steer"] == {"previous_response_id": "", "input": ""} and "stream_id" not in second


def test_valid_message_forms() -> None:
    s = Session("t")
    running(s)
    forms = [
        "plain",
        [{"role": "user", "content": "easy"}],
        [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "parts"}]}],
        [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]}],
        [{"role": "user", "content": [{"type": "input_file", "file_data": "data:text/plain;base64,AA", "filename": "a.txt"}]}],
    ]
    for value in forms:
        s.receive(steer("resp_t", value))
    assert [d["type"] for d in drained(s)] == ["response.steer.accepted"] * len(forms)


# -- the target's state ----------------------------------------------------------------------------------


def test_unknown_target_is_not_found() -> None:
    s = Session("t")
    s.receive(steer("resp_nope"))
    (failed,) = drained(s)
    assert failed["error"]["code"] == "response_not_found" and "stream_id" not in failed
    assert failed["steer"] == {"previous_response_id": "resp_nope", "input": "shorter"}


def test_completed_and_not_active_targets() -> None:
    s = Session("t")
    turn = running(s, stream_id="a")
    s.finished(turn, ended("resp_t", "a"))
    turn = running(s, "resp_cut")
    s.finished(turn, ended("resp_cut", status="incomplete"))
    s.receive(steer("resp_t"))
    s.receive(steer("resp_cut"))
    done, cut = drained(s)
    assert done["error"]["code"] == "response_already_completed" and done["stream_id"] == "a"
    assert cut["error"]["code"] == "response_not_active" and "stream_id" not in cut


def test_steering_not_supported() -> None:
    """A service without steering (the bridge), or a response with automatic compaction."""
    assert not bridge_service(object()).core.supports_steering  # type: ignore[arg-type]
    s = Session("t")
    running(s, "resp_a", supported=False)
    running(s, "resp_b", stream_id="b", context_management=[{"type": "compaction", "compact_threshold": 1000}])
    s.receive(steer("resp_a"))
    s.receive(steer("resp_b"))
    a, b = drained(s)
    assert a["error"]["code"] == b["error"]["code"] == "steering_not_supported"
    assert b["stream_id"] == "b" and "id" not in b["steer"]


def test_too_many_pending_steers() -> None:
    s = Session("t", SessionConfig(max_pending_steers=2))
    running(s)
    for text in ("a", "b", "c"):
        s.receive(steer("resp_t", text))
    kinds = [(d["type"], d.get("error", {}).get("code")) for d in drained(s)]
    assert kinds == [("response.steer.accepted", None)] * 2 + [("response.steer.failed", "too_many_pending_steers")]


# -- the target ends ------------------------------------------------------------------------------------


def test_a_steered_target_gets_a_successor_first_on_its_lane() -> None:
    s = Session("t")
    turn = running(s, stream_id="a", instructions="be kind", metadata={"k": "v"}, max_output_tokens=99, store=False)
    s.receive(steer("resp_t", "first"))
    s.receive(steer("resp_t", [{"role": "user", "content": "second"}]))
    ids = [d["steer"]["id"] for d in drained(s)]
    s.receive(create(input="queued by the client", stream_id="a"))
    s.finished(turn, ended("resp_t", "a"))
    assert drained(s) == []
    (successor,) = s.startable()
    assert s.startable() == []  # the lane is busy with the successor; the client's create waits
    assert successor.successor and successor.lane == "a" and [st.id for st in successor.steers] == ids
    r = successor.request
    assert r.previous_response_id == "resp_t" and r.instructions == "be kind" and r.metadata == {"k": "v"}
    assert r.max_output_tokens == 99 and r.store is False and r.generate
    assert input_of(successor) == [
        {"type": "message", "role": "user", "content": "first"},
        {"type": "message", "role": "user", "content": "second"},
    ]
    s.activate(successor, "resp_s", True)
    s.finished(successor, ended("resp_s", "a"))
    assert s.steering.committed == 2
    (queued,) = s.startable()
    assert not queued.successor and queued.steers == []


def test_a_failed_target_returns_the_input() -> None:
    s = Session("t")
    turn = running(s, stream_id="a")
    s.receive(steer("resp_t", "x"))
    (accepted,) = drained(s)
    s.finished(turn, None)
    (failed,) = drained(s)
    assert failed["type"] == "response.steer.failed" and failed["stream_id"] == "a"
    assert failed["steer"] == {"id": accepted["steer"]["id"], "previous_response_id": "resp_t", "input": "x"}
    assert failed["error"] == {"type": "invalid_request_error", "code": "successor_creation_failed", "message": SUCCESSOR_FAILED}
    assert s.startable() == []


def test_a_successor_rejected_before_created_returns_the_input_without_an_error_event() -> None:
    s = Session("t")
    turn = running(s)
    s.receive(steer("resp_t", "x"))
    drained(s)
    s.finished(turn, ended("resp_t"))
    (successor,) = s.startable()
    s.activate(successor, "resp_s", True)
    s.rejected(successor, invalid_request("no images", "input", "unsupported_value"))
    s.finished(successor, None)
    (failed,) = drained(s)
    assert failed["type"] == "response.steer.failed" and failed["error"]["code"] == "successor_creation_failed"
    assert failed["steer"]["input"] == "x" and STEER_ID.fullmatch(failed["steer"]["id"])
    assert s.steering.committed == 0


def _with_calls(s: Session, lane: str | None = "a") -> tuple[PendingTurn, ResponseState]:
    turn = running(s, stream_id=lane) if lane else running(s)
    calls: list[Item] = [
        FunctionCall(call_id="call_f", name="get_status", arguments="{}"),
        CustomToolCall(call_id="call_c", name="patch", input="diff"),
    ]
    return turn, ended("resp_t", lane, calls)


def test_pending_when_the_target_waits_for_tool_output() -> None:
    s = Session("t")
    turn, final = _with_calls(s)
    s.receive(steer("resp_t", "one"))
    s.receive(steer("resp_t", "two"))
    ids = [d["steer"]["id"] for d in drained(s)]
    s.finished(turn, final)
    events = drained(s)
    assert [e["type"] for e in events] == ["response.steer.pending"] * 2
    for e, steer_id in zip(events, ids, strict=True):
        assert set(e) == {"type", "sequence_number", "steer", "reason", "required_input", "stream_id"}
        assert e["steer"] == {"id": steer_id, "previous_response_id": "resp_t"} and e["stream_id"] == "a"
        assert e["reason"] == "waiting_for_required_input"
        assert e["required_input"] == [
            {"type": "function_call_output", "call_id": "call_f", "name": "get_status"},
            {"type": "custom_tool_call_output", "call_id": "call_c"},
        ]
    assert s.startable() == []  # no automatic successor
    # Other lanes and other parents do not take the input; the matching continuation does, once.
    s.receive(create(input="other lane", stream_id="b", previous_response_id="resp_t"))
    (other,) = s.startable()
    assert other.steers == [] and text_inputs(other) == ["other lane"]
    outputs = [
        {"type": "function_call_output", "call_id": "call_f", "output": "ok"},
        {"type": "custom_tool_call_output", "call_id": "call_c", "output": "applied"},
    ]
    s.receive(create(input=outputs, stream_id="a", previous_response_id="resp_t"))
    (cont,) = s.startable()
    assert [st.id for st in cont.steers] == ids
    assert input_of(cont) == [
        {"type": "message", "role": "user", "content": "one"},
        {"type": "message", "role": "user", "content": "two"},
        *outputs,
    ]
    s.activate(cont, "resp_c", True)
    s.finished(cont, ended("resp_c", "a"))
    s.receive(create(input="again", stream_id="a", previous_response_id="resp_t"))
    (again,) = s.startable()
    assert again.steers == [] and text_inputs(again) == ["again"]  # at most once
    assert s.steering.committed == 2


def test_a_string_continuation_gets_the_input_prepended() -> None:
    s = Session("t")
    turn, final = _with_calls(s, None)
    s.receive(steer("resp_t", "steer"))
    drained(s)
    s.finished(turn, final)
    drained(s)
    s.receive(create(input="client text", previous_response_id="resp_t"))
    (cont,) = s.startable()
    assert text_inputs(cont) == ["steer", "client text"]


def test_a_rejected_continuation_reports_both_the_error_and_the_input() -> None:
    s = Session("t")
    turn, final = _with_calls(s)
    s.receive(steer("resp_t", "steer"))
    drained(s)
    s.finished(turn, final)
    drained(s)
    s.receive(create(input="x", stream_id="a", previous_response_id="resp_t"))
    (cont,) = s.startable()
    s.rejected(cont, invalid_request("bad", "input", "invalid_value"))
    error, failed = drained(s)
    assert error["type"] == "error" and error["stream_id"] == "a"
    assert failed["type"] == "response.steer.failed" and failed["error"]["code"] == "successor_creation_failed"


def test_a_newer_pending_parent_on_the_lane_returns_the_older_input() -> None:
    s = Session("t")
    turn, final = _with_calls(s)
    s.receive(steer("resp_t", "old"))
    drained(s)
    s.finished(turn, final)
    drained(s)
    s.receive(create(input="elsewhere", stream_id="a"))
    (turn2,) = s.startable()
    s.activate(turn2, "resp_2", True)
    s.receive(steer("resp_2", "new"))
    drained(s)
    s.finished(turn2, ended("resp_2", "a", [FunctionCall(call_id="call_g", name="f", arguments="{}")]))
    returned, pending = drained(s)
    assert returned["type"] == "response.steer.failed" and returned["steer"]["input"] == "old"
    assert returned["error"]["code"] == "response_not_active"
    assert pending["type"] == "response.steer.pending" and pending["steer"]["previous_response_id"] == "resp_2"


def test_close_discards_steering_state() -> None:
    s = Session("t")
    turn, final = _with_calls(s)
    s.receive(steer("resp_t", "x"))
    s.close()
    assert s.steering.active == {} and s.steering.awaiting == {}
    assert turn.response_id == "resp_t" and final.response.id == "resp_t"


def test_no_successor_past_the_connection_lifetime() -> None:
    s = Session("t", SessionConfig(lifetime_s=60), now=0.0)
    turn = running(s)
    s.receive(steer("resp_t", "x"))
    drained(s)
    s.tick(61.0)
    s.finished(turn, ended("resp_t"))
    (failed,) = drained(s)
    assert failed["type"] == "response.steer.failed" and failed["error"]["code"] == "successor_creation_failed"
    assert s.startable() == []


# -- invariant (hypothesis) ---------------------------------------------------------------------------

_steers = st.lists(st.tuples(st.booleans(), st.text(min_size=1, max_size=8)), max_size=12)


@settings(max_examples=150, deadline=None)
@given(submissions=_steers, ending=st.sampled_from(["plain", "calls", "failed"]), limit=st.integers(1, 6))
def test_every_accepted_steer_is_committed_pending_or_returned_once(
    submissions: list[tuple[bool, str]], ending: str, limit: int
) -> None:
    """Each steer frame gets exactly one answer; every accepted steer then ends in exactly one
    place — the successor's input (in submission order), a pending event, or a failure that
    returns its input — never two, never none."""
    s = Session("t", SessionConfig(max_pending_steers=limit))
    turn = running(s, stream_id="lane")
    accepted: list[tuple[str, str]] = []
    for valid, text in submissions:
        s.receive(steer("resp_t", text if valid else [{"role": "assistant", "content": text}]))
        (answer,) = drained(s)
        if answer["type"] == "response.steer.accepted":
            assert valid and len(accepted) < limit
            accepted.append((answer["steer"]["id"], text))
        else:
            code = answer["error"]["code"]
            assert code == ("invalid_input" if not valid else "too_many_pending_steers")
            assert "id" not in answer["steer"]
    assert len({i for i, _ in accepted}) == len(accepted) and all(STEER_ID.fullmatch(i) for i, _ in accepted)
    if ending == "failed":
        s.finished(turn, None)
    elif ending == "calls":
        s.finished(turn, ended("resp_t", "lane", [FunctionCall(call_id="c", name="f", arguments="{}")]))
    else:
        s.finished(turn, ended("resp_t", "lane"))
    events = drained(s)
    successors = s.startable()
    if not accepted:
        assert events == [] and successors == []
        return
    if ending == "plain":
        assert events == []
        (successor,) = successors
        assert [st_.id for st_ in successor.steers] == [i for i, _ in accepted]
        assert text_inputs(successor) == [t for _, t in accepted]
    elif ending == "calls":
        assert successors == []
        assert [(e["type"], e["steer"]["id"]) for e in events] == [("response.steer.pending", i) for i, _ in accepted]
    else:
        assert successors == []
        assert [(e["steer"]["id"], e["steer"]["input"]) for e in events] == accepted
        assert {e["error"]["code"] for e in events} == {"successor_creation_failed"}
