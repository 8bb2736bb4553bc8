"""Steering (``response.steer``, spec/ws-mode.md §2.2, §3.3; conformance items 37-41) over a real
loopback WebSocket with the raw ``websockets`` client (every event validated strictly against the
SDK's types by ``wsclient.check_event``) and the recording backend, whose gates hold a response
open so that a steer lands mid-answer deterministically (event order, never time).
"""

from __future__ import annotations

import json
import re
from typing import Any

from backends import RecordingBackend, expected, until, user_key
from wsclient import RENDERER, WS, check_stream, function_tool, split_responses, ws_connect

from responses_cache import Biller
from responses_cache.billing import CallableSink, UsageRecord
from responses_cache.protocol.request import decode_input
from responses_cache.session.session import SessionConfig

STEER_ID = re.compile(r"steer_[0-9a-f]{32}")
LONG = "one two three four five six seven eight nine ten"
TOOLS = [function_tool()]



def steer(target: str, value: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "response.steer", "previous_response_id": target, "input": value, **extra}


async def started(ws: WS, **body: Any) -> str:
    """Send a create that holds at a gate after its first delta; returns its response id."""
    await ws.create(**body)
    events = await ws.recv_until(lambda d: d["type"] in ("response.output_text.delta", "response.function_call_arguments.delta"))
    return str(events[0]["response"]["id"])


def accepted_shape(event: dict[str, Any], target: str, lane: str | None) -> str:
    keys = {"type", "sequence_number", "steer"} | ({"stream_id"} if lane else set())
    assert set(event) == keys, event
    assert event["type"] == "response.steer.accepted" and event.get("stream_id") == lane
    assert set(event["steer"]) == {"id", "previous_response_id"} and event["steer"]["previous_response_id"] == target
    assert STEER_ID.fullmatch(event["steer"]["id"]), event
    return str(event["steer"]["id"])


def failed_shape(event: dict[str, Any], target: str, value: Any, code: str, lane: str | None, steer_id: str | None = None) -> None:
    keys = {"type", "sequence_number", "steer", "error"} | ({"stream_id"} if lane else set())
    assert set(event) == keys, event
    assert event["type"] == "response.steer.failed" and event.get("stream_id") == lane
    want = {"previous_response_id": target, "input": value} | ({"id": steer_id} if steer_id else {})
    assert event["steer"] == want, event
    assert set(event["error"]) == {"type", "code", "message"}, event
    assert event["error"]["type"] == "invalid_request_error" and event["error"]["code"] == code
    assert isinstance(event["error"]["message"], str) and event["error"]["message"]


# -- 37: invalid input ------------------------------------------------------------------------------


async def test_invalid_steers_return_their_input_with_invalid_input(serve: Any, backend: RecordingBackend) -> None:
    """Item 37: extra fields (``stream_id`` too), a non-user role, tool outputs, another item type,
    an empty array or bad content parts → ``invalid_input`` with the original input, no id, the
    target's lane; the target is not steered by any of them."""
    server = serve()
    bad: list[tuple[Any, dict[str, Any]]] = [
        ("shorter", {"stream_id": "agent"}),
        ("shorter", {"metadata": {}}),
        ([{"role": "assistant", "content": "I said so"}], {}),
        ([{"role": "system", "content": "obey"}], {}),
        ([{"type": "function_call_output", "call_id": "c", "output": "x"}], {}),
        ([{"role": "user", "content": "x", "id": "msg_1"}], {}),
        ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}], {}),
        ([], {}),
        ("", {}),
        (42, {}),
    ]
    async with ws_connect(server.ws_url) as ws:
        target = await started(ws, input="hi", stream_id="agent", metadata={"text": LONG, "gate": "g"})
        for value, extra in bad:
            await ws.send(steer(target, value, **extra))
            failed_shape(await ws.recv(), target, value, "invalid_input", "agent")
        backend.gates.release("g")
        events = await ws.finish("agent")
    response = check_stream([e for e in ws.log if not e["type"].startswith("response.steer.")])
    assert response["status"] == "completed" and events[-1]["type"] == "response.completed"
    assert len(backend.calls) == 1  # no successor


# -- 38, 39: accepted → incomplete (steered) → successor ---------------------------------------------


async def test_steer_mid_answer_ends_target_steered_and_starts_a_successor(serve: Any, backend: RecordingBackend) -> None:
    """Items 38, 39: accepted with ``steer.id`` and ``steer.previous_response_id``; the target stops
    at its next delta (the engine's request is closed) and ends ``incomplete``/``steered``; a
    successor ``response.created`` follows on the same lane, continuing from the target with the
    steering input appended, and completes."""
    server = serve()
    steer_input = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Be brief."}]}]
    async with ws_connect(server.ws_url) as ws:
        target = await started(ws, input="explain", stream_id="agent", store=False, metadata={"text": LONG, "gate": "g", "tag": "t"})
        await ws.send(steer(target, steer_input))
        steer_id = accepted_shape(await ws.recv(), target, "agent")
        backend.gates.release("g")
        first = await ws.finish("agent")
        second = await ws.finish("agent")
    streams = split_responses([e for e in ws.log if not e["type"].startswith("response.steer.")])
    assert len(streams) == 2
    done = check_stream(streams[0])
    assert first[-1]["type"] == "response.incomplete" and done["status"] == "incomplete"
    assert done["incomplete_details"] == {"reason": "steered"}
    (message,) = done["output"]
    assert message["status"] == "incomplete" and message["content"][0]["text"] == "one "
    successor = check_stream(streams[1])
    assert second[0]["type"] == "response.created" and second[0]["stream_id"] == "agent"
    assert successor["status"] == "completed" and successor["previous_response_id"] == target
    assert successor["id"] != target and successor["store"] is False
    assert [c.outcome for c in backend.calls] == ["closed", "finished"]
    assert server.app.state.metrics.total("responses_steered_total") == 1
    sent = backend.calls[1]
    assert sent.identities() == expected("explain", done, steer_input)
    assert sent.metadata["tag"] == "t"  # the successor inherits the target's settings
    assert steer_id not in json.dumps(successor)
    if RENDERER is not None:  # the whole target was the successor's cached prefix
        assert successor["usage"]["input_tokens_details"]["cached_tokens"] > 0


async def test_steers_are_appended_in_submission_order(serve: Any, backend: RecordingBackend) -> None:
    """Two steers before the boundary: one successor, their input in submission order; a steer
    without a lane gets events without ``stream_id``."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        target = await started(ws, input="go", metadata={"text": LONG, "gate": "g"})
        await ws.send(steer(target, "first"))
        a = accepted_shape(await ws.recv(), target, None)
        await ws.send(steer(target, [{"role": "user", "content": "second"}, {"type": "message", "role": "user", "content": "third"}]))
        b = accepted_shape(await ws.recv(), target, None)
        assert a != b
        backend.gates.release("g")
        await ws.finish()
        await ws.finish()
    assert len(backend.calls) == 2
    assert backend.calls[1].identities()[-3:] == [user_key("first"), user_key("second"), user_key("third")]


async def test_a_steer_after_the_last_item_lets_the_target_complete(serve: Any, backend: RecordingBackend) -> None:
    """A steer that arrives when the answer has no delta left: the target completes normally and
    the successor still follows (spec §2.2 step 2b)."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        target = await started(ws, input="go", metadata={"text": "single", "gate": "g"})
        await ws.send(steer(target, "and then?"))
        accepted_shape(await ws.recv(), target, None)
        backend.gates.release("g")
        first = await ws.finish()
        second = await ws.finish()
    assert first[-1]["type"] == "response.completed" and first[-1]["response"]["output"][0]["content"][0]["text"] == "single"
    assert second[-1]["type"] == "response.completed" and second[-1]["response"]["previous_response_id"] == target
    assert backend.calls[1].identities()[-1] == user_key("and then?")


async def test_successor_prompt_is_a_full_render_and_appends_only_the_steering_tokens(
    serve: Any, backend: RecordingBackend
) -> None:
    """Fidelity: the successor's prompt equals a fresh full render of the whole conversation (the
    target's input, its partial output, the steering input). Counting: the successor's token log
    is the target's log plus the steering message — every token before it is the cached prefix."""
    if RENDERER is None:
        return
    server = serve()
    instructions = "You are terse."
    async with ws_connect(server.ws_url) as ws:
        target = await started(ws, input="explain", instructions=instructions, tools=TOOLS, metadata={"text": LONG, "gate": "g"})
        await ws.send(steer(target, "Now in French."))
        await ws.recv()
        backend.gates.release("g")
        first = await ws.finish()
        second = await ws.finish()
    done, successor = first[-1]["response"], second[-1]["response"]
    call = backend.calls[1]
    prompt = call.request.prompt
    assert prompt is not None
    r = prompt.renderer
    conversation = [{"role": "user", "content": "explain"}, *done["output"], {"role": "user", "content": "Now in French."}]
    items = decode_input(json.dumps(conversation).encode())
    fresh = list(r.prompt(r.render_full(instructions, call.request.tools, items)))
    assert list(prompt.tokens()) == fresh
    # The target's log (its prompt and its output) is the successor's cached prefix; only the
    # steering message (and the generation prompt) is new.
    target_log = r.render_full(instructions, call.request.tools, items[:-1])
    steer_only = r.render_full(instructions, call.request.tools, items).num_tokens - target_log.num_tokens
    usage = successor["usage"]
    assert usage["input_tokens"] == len(fresh)
    assert usage["input_tokens_details"]["cached_tokens"] == target_log.num_tokens
    assert usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"] == steer_only + len(r.generation_prompt)


async def test_both_responses_are_billed(serve: Any, backend: RecordingBackend) -> None:
    """The steered target and its successor each get a usage record: the target as ``incomplete``
    with the output it produced, the successor chained to it."""
    records: list[UsageRecord] = []
    biller = Biller(CallableSink(records.extend), flush_interval=0.001)
    server = serve(billing=biller)
    async with ws_connect(server.ws_url) as ws:
        target = await started(ws, input="go", metadata={"text": LONG, "gate": "g"})
        await ws.send(steer(target, "stop there"))
        await ws.recv()
        backend.gates.release("g")
        first = (await ws.finish())[-1]["response"]
        second = (await ws.finish())[-1]["response"]
    server.stop()
    by_id = {r.response_id: r for r in records}
    assert set(by_id) == {first["id"], second["id"]}
    assert by_id[first["id"]].status == "incomplete" and by_id[second["id"]].status == "completed"
    assert by_id[second["id"]].previous_response_id == first["id"]
    for response in (first, second):
        record = by_id[response["id"]]
        assert (record.input_tokens, record.output_tokens) == (response["usage"]["input_tokens"], response["usage"]["output_tokens"])
    assert by_id[first["id"]].output_tokens == 1  # one delta before the boundary


# -- 40: pending while a tool call is outstanding -----------------------------------------------------


async def test_steer_during_a_tool_call_is_pending_then_prepended(serve: Any, backend: RecordingBackend) -> None:
    """Item 40: a tool call is never cut; the target completes with it, ``response.steer.pending``
    (reason ``waiting_for_required_input``, the call's stub) follows ``response.completed``, and
    the client's continuation of that parent on that lane gets the steering input prepended."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        target = await started(
            ws, input="run it", tools=TOOLS, stream_id="agent", store=False,
            metadata={"call": "run", "args": '{"step": 1, "why": "because"}', "call_id": "call_a", "gate": "g"},
        )
        await ws.send(steer(target, "use step 2 next"))
        steer_id = accepted_shape(await ws.recv(), target, "agent")
        backend.gates.release("g")
        done = await ws.finish("agent")
        pending = await ws.recv()
        output = [{"type": "function_call_output", "call_id": "call_a", "output": "ran"}]
        await ws.create(input=output, previous_response_id=target, tools=TOOLS, stream_id="agent", store=False, metadata={"tag": "c"})
        cont = await ws.finish("agent")
    assert done[-1]["type"] == "response.completed"
    assert set(pending) == {"type", "sequence_number", "steer", "reason", "required_input", "stream_id"}
    assert pending["type"] == "response.steer.pending" and pending["stream_id"] == "agent"
    assert pending["steer"] == {"id": steer_id, "previous_response_id": target}
    assert pending["reason"] == "waiting_for_required_input"
    assert pending["required_input"] == [{"type": "function_call_output", "call_id": "call_a", "name": "run"}]
    assert pending["sequence_number"] > 0  # after the accepted event, on the steering counter
    response = check_stream(cont)
    assert response["status"] == "completed" and response["previous_response_id"] == target
    assert len(backend.calls) == 2  # no automatic successor
    assert backend.by_tag("c").identities() == expected("run it", done[-1]["response"], "use step 2 next", output)


async def test_a_continuation_sent_before_the_pending_event_still_gets_the_input(
    serve: Any, backend: RecordingBackend
) -> None:
    """The client need not wait for ``response.steer.pending``: a continuation queued behind the
    target gets the input prepended too (two steers, in submission order)."""
    server = serve()
    output = [{"type": "function_call_output", "call_id": "call_b", "output": "ran"}]
    async with ws_connect(server.ws_url) as ws:
        target = await started(ws, input="run it", tools=TOOLS, metadata={"call": "run", "args": '{"a": 1}', "call_id": "call_b", "gate": "g"})
        await ws.send(steer(target, "A"))
        await ws.recv()
        await ws.send(steer(target, "B"))
        await ws.recv()
        await ws.create(input=output, previous_response_id=target, tools=TOOLS, metadata={"tag": "c"})
        backend.gates.release("g")
        done = await ws.finish()
        await ws.recv_until(lambda d: d["type"] == "response.steer.pending")
        await ws.recv_until(lambda d: d["type"] == "response.steer.pending")
        await ws.finish()
    assert backend.by_tag("c").identities() == expected("run it", done[-1]["response"], "A", "B", output)


# -- 41 and the other failure codes --------------------------------------------------------------------


async def test_unknown_or_foreign_targets_are_not_found(serve: Any) -> None:
    """Item 41: an unknown id, or a response of another connection → ``response_not_found``
    without ``stream_id``."""
    server = serve()
    async with ws_connect(server.ws_url) as other:
        foreign = (await other.ok(input="hi", stream_id="x", store=False))["id"]
    async with ws_connect(server.ws_url) as ws:
        for target in ("resp_nope", foreign):
            await ws.send(steer(target, "x"))
            failed_shape(await ws.recv(), target, "x", "response_not_found", None)


async def test_completed_incomplete_and_unsupported_targets(serve: Any, backend: RecordingBackend) -> None:
    """A completed target → ``response_already_completed``; one that ended ``incomplete`` →
    ``response_not_active``; an active response using automatic compaction
    (``context_management``) → ``steering_not_supported`` (item 41)."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        done = await ws.ok(input="hi", stream_id="a")
        await ws.send(steer(done["id"], "later"))
        failed_shape(await ws.recv(), done["id"], "later", "response_already_completed", "a")
        cut = (await ws.turn(input="hi", metadata={"finish": "length"}))[-1]["response"]
        await ws.send(steer(cut["id"], "later"))
        failed_shape(await ws.recv(), cut["id"], "later", "response_not_active", None)
        target = await started(
            ws, input="hi", context_management=[{"type": "compaction", "compact_threshold": 1000}], metadata={"text": LONG, "gate": "g"}
        )
        await ws.send(steer(target, "x"))
        failed_shape(await ws.recv(), target, "x", "steering_not_supported", None)
        backend.gates.release("g")
        assert (await ws.finish())[-1]["type"] == "response.completed"


async def test_too_many_pending_steers(serve: Any, backend: RecordingBackend) -> None:
    server = serve(session=SessionConfig(max_pending_steers=2))
    async with ws_connect(server.ws_url) as ws:
        target = await started(ws, input="hi", metadata={"text": LONG, "gate": "g"})
        for text in ("a", "b"):
            await ws.send(steer(target, text))
            accepted_shape(await ws.recv(), target, None)
        await ws.send(steer(target, "c"))
        failed_shape(await ws.recv(), target, "c", "too_many_pending_steers", None)
        backend.gates.release("g")
        await ws.finish()
        await ws.finish()
    assert backend.calls[1].identities()[-2:] == [user_key("a"), user_key("b")]


async def test_a_successor_that_cannot_start_returns_the_input(serve: Any, backend: RecordingBackend) -> None:
    """The successor fails before its ``response.created`` (the model takes no images): each
    accepted steer comes back in ``response.steer.failed`` / ``successor_creation_failed`` with its
    id and original input; no ``error`` event (the client sent no create); the lane goes on."""
    backend.accepts_media = False
    server = serve()
    image = [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]
    async with ws_connect(server.ws_url) as ws:
        target = await started(ws, input="hi", stream_id="l", metadata={"text": LONG, "gate": "g"})
        await ws.send(steer(target, image))
        steer_id = accepted_shape(await ws.recv(), target, "l")
        backend.gates.release("g")
        assert (await ws.finish("l"))[-1]["type"] == "response.incomplete"
        failed = await ws.recv()
        failed_shape(failed, target, image, "successor_creation_failed", "l", steer_id)
        assert failed["error"]["message"] == (
            "We couldn't start the next response. Send this steering input again with response.create."
        )
        again = await ws.ok(input="go on", previous_response_id=target, stream_id="l")
    assert again["previous_response_id"] == target
    assert not any(e["type"] == "error" for e in ws.log)


async def test_closing_discards_queued_steering(serve: Any, backend: RecordingBackend) -> None:
    """Item 33 for steering: the socket closes with a steer accepted; nothing runs after."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        target = await started(ws, input="hi", metadata={"text": LONG, "gate": "g"})
        await ws.send(steer(target, "x"))
        await ws.recv()
    await until(lambda: backend.calls[0].outcome != "running", "the target to stop")
    backend.gates.release("g")
    assert len(backend.calls) == 1


async def test_the_simulated_engine_is_steered(responses_cache_server_factory: Any) -> None:
    """The default engine (paced, not instant): a steer after the first delta of a 2,000-token
    answer ends it ``steered`` before its end, and the successor answers.

    Until the steer is accepted the engine's clock stands still, so each token waits a little
    longer than the one before (token i: i/2000 s): it keeps producing while the steer is on its
    way, and reaching the end on its own would take over 15 minutes. Then the clock runs again.
    The steer cannot lose the race, however slow the machine (nothing is timed)."""
    import threading
    import time

    from responses_cache import SimulatedConfig, SimulatedEngine

    accepted = threading.Event()
    engine = SimulatedEngine(SimulatedConfig(answer_tokens=2000, output_tokens_per_s=2000),
                             clock=lambda: time.perf_counter() if accepted.is_set() else 0.0)
    server = responses_cache_server_factory(backend=engine)
    async with ws_connect(server.ws_url) as ws:
        await ws.create(model="sim-1", input="Write a report.")
        target = (await ws.recv())["response"]["id"]
        await ws.recv_until(lambda d: d["type"] == "response.output_text.delta")
        await ws.send(steer(target, "Just the title."))
        await ws.recv_until(lambda d: d["type"] == "response.steer.accepted")
        accepted.set()
        first = await ws.finish()
        second = await ws.finish()
    done, successor = first[-1]["response"], second[-1]["response"]
    assert done["status"] == "incomplete" and done["incomplete_details"] == {"reason": "steered"}
    assert done["usage"]["output_tokens"] < 2000
    assert successor["status"] == "completed" and successor["previous_response_id"] == target
    assert successor["usage"]["input_tokens_details"]["cached_tokens"] > 0
    assert engine.requests == 2
