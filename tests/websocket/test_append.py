"""The ``response.append`` extension over a real loopback WebSocket (raw ``websockets`` client,
every standard event validated strictly against the SDK's types by ``wsclient.check_event``, the
extension's own ``response.awaiting_input`` checked field for field): one response stays open
across a three-call tool loop, the engine's prompts grow by appending, and one usage record (with
the summed usage) is written, once opened and once closed in the billing journal.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

import msgspec
from wsclient import (
    ERROR_KEYS,
    RENDERER,
    TERMINAL,
    WS,
    check_event,
    check_stream,
    function_tool,
    ws_connect,
)

from responses_cache import Biller
from responses_cache.backends.base import BackendEvent, Finish, GenerationRequest
from responses_cache.backends.simulated import Scenario, SimulatedConfig, SimulatedEngine
from responses_cache.billing import CallableSink, UsageRecord
from responses_cache.billing.journal import (
    AckEntry,
    CloseEntry,
    MarkEntry,
    OpenEntry,
    recovered_record,
)
from responses_cache.pipeline.hooks import HookContext, Phase, Verdict
from responses_cache.protocol.items import FunctionCallOutput, Item
from responses_cache.protocol.request import decode_input
from responses_cache.session.session import SessionConfig

MODEL = "rec-1"
TOOLS = [function_tool()]
INSTRUCTIONS = "Use the tool."
APPEND_ON = SessionConfig(allow_append=True)
AWAITING_KEYS = {"type", "sequence_number", "response_id", "call_ids"}


class RecordingEngine:
    """The simulated engine in scenario mode (``calls`` tool calls, then an answer), recording the
    prompt and the conversation of every engine call, and the usage each one reported."""

    accepts_media = True

    def __init__(self, calls: int = 3) -> None:
        scenario = Scenario(tool_calls=calls, argument_tokens=3, answer_tokens=4)
        self.engine = SimulatedEngine(SimulatedConfig(instant=True, scenario=scenario, model_names=(MODEL,)))
        self.requests: list[GenerationRequest] = []
        self.finishes: list[Finish] = []
        self.closed = 0
        #: The renderer's items rendered or taken from sampled ids so far, at each call.
        self.rendered: list[int] = []

    def models(self) -> Sequence[str]:
        return [MODEL]

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self.requests.append(request)
        if request.prompt is not None:
            stats = request.prompt.renderer.stats
            self.rendered.append(stats.items_rendered + stats.items_sampled)
        try:
            async for event in self.engine.generate(request):
                if isinstance(event, Finish):
                    self.finishes.append(event)
                yield event
        finally:
            self.closed += 1


async def recv(ws: WS) -> dict[str, Any]:
    raw = await asyncio.wait_for(ws.conn.recv(), 15)
    assert isinstance(raw, str)
    d: dict[str, Any] = json.loads(raw)
    if d.get("type") == "response.awaiting_input":
        assert set(d) == AWAITING_KEYS | ({"stream_id"} if "stream_id" in d else set()), d
        assert isinstance(d["sequence_number"], int) and d["response_id"].startswith("resp_")
        assert d["call_ids"] and all(isinstance(c, str) and c for c in d["call_ids"]), d
    else:
        check_event(d)
    ws.log.append(d)
    return d


async def until(ws: WS, *kinds: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        d = await recv(ws)
        out.append(d)
        if d["type"] in kinds:
            return out


def outputs(call_ids: list[str], text: str = "done") -> list[dict[str, Any]]:
    return [{"type": "function_call_output", "call_id": c, "output": f"{text} {c}"} for c in call_ids]


def append(response_id: str, items: Any) -> dict[str, Any]:
    return {"type": "response.append", "response_id": response_id, "input": items}


def assert_error(event: dict[str, Any], code: str, param: str | None, stream_id: str | None = None) -> None:
    assert event["type"] == "error" and event["status"] == 400, event
    assert set(event) == {"type", "status", "error"} | ({"stream_id"} if stream_id else set()), event
    assert event.get("stream_id") == stream_id
    assert set(event["error"]) == ERROR_KEYS, event
    assert event["error"]["type"] == "invalid_request_error"
    assert (event["error"]["code"], event["error"]["param"]) == (code, param), event


async def tool_loop(ws: WS, **body: Any) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """One response through its tool calls, appending every output; (its events, what was appended)."""
    await ws.create(model=MODEL, input="go", tools=TOOLS, instructions=INSTRUCTIONS, append=True, **body)
    events: list[dict[str, Any]] = []
    appended: list[list[dict[str, Any]]] = []
    while True:
        got = await until(ws, "response.awaiting_input", *TERMINAL)
        events += got
        last = got[-1]
        if last["type"] in TERMINAL:
            return events, appended
        items = outputs(last["call_ids"])
        appended.append(items)
        await ws.send(append(last["response_id"], items))


async def test_a_tool_loop_runs_inside_one_response(serve: Any, tmp_path: Path) -> None:
    engine = RecordingEngine(calls=3)
    records: list[UsageRecord] = []
    journal_path = tmp_path / "billing.journal"
    biller = Biller(CallableSink(records.extend), journal_path=journal_path, flush_interval=3600)  # acked at shutdown
    server = serve(backend=engine, session=APPEND_ON, billing=biller)
    async with ws_connect(server.ws_url) as ws:
        events, appended = await tool_loop(ws)
        # The journal has the response's open entry and its close entry before the terminal event.
        decoder = msgspec.json.Decoder(OpenEntry | MarkEntry | CloseEntry | AckEntry)
        entries = [decoder.decode(line) for line in journal_path.read_bytes().splitlines() if line]
    server.stop()

    # One response: created once, one terminal event, sequence numbers continuous across appends.
    awaiting = [e for e in events if e["type"] == "response.awaiting_input"]
    standard = [e for e in events if e["type"] != "response.awaiting_input"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    response = check_stream(standard[:1] + [{**e, "sequence_number": i + 1} for i, e in enumerate(standard[1:])])
    assert response["status"] == "completed"
    assert len(awaiting) == 3 and {e["response_id"] for e in awaiting} == {response["id"]}
    # Output items accumulate: three calls (each awaited by id), then the answer.
    kinds = [item["type"] for item in response["output"]]
    assert kinds == ["function_call"] * 3 + ["message"]
    assert [e["call_ids"] for e in awaiting] == [[item["call_id"]] for item in response["output"][:3]]
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [0, 1, 2, 3]
    # awaiting_input comes after the call item is done, and nothing of the response comes after
    # it until the client appends.
    for e in awaiting:
        assert events[events.index(e) - 1]["type"] == "response.output_item.done"

    # Each engine call's prompt = the previous prompt + what it sampled + the appended outputs
    # (extended, not re-rendered), and equals a fresh full render of the conversation so far.
    assert len(engine.requests) == 4 and engine.closed == 4
    conversation: list[Any] = [{"role": "user", "content": "go"}]
    cached_expected = 0
    for i, request in enumerate(engine.requests):
        assert type(request.conversation.items()[-1]).__name__ == ("Message" if i == 0 else "FunctionCallOutput")
        if i:
            conversation += [response["output"][i - 1], *appended[i - 1]]
        items = decode_input(json.dumps(conversation).encode())
        assert len(request.conversation.items()) == len(items)
        if RENDERER is None:
            continue
        prompt = request.prompt
        assert prompt is not None
        r = prompt.renderer
        assert list(prompt.tokens()) == list(r.prompt(r.render_full(INSTRUCTIONS, request.tools, items)))
        if i:
            before = engine.requests[i - 1].prompt
            assert before is not None
            assert prompt.log.common_prefix(before.log) == before.log.num_tokens
            # Appended: between two engine calls only the sampled call and its output were
            # rendered (or taken from sampled ids), never the history before them.
            assert engine.rendered[i] - engine.rendered[i - 1] == 1 + len(appended[i - 1])
            # The cached prefix: everything up to the sampled call (only the outputs are new).
            cached_expected += r.render_full(INSTRUCTIONS, request.tools, items[: -len(appended[i - 1])]).num_tokens

    # One usage record, summed over the four engine calls; one open and one close in the journal.
    assert [r.response_id for r in records] == [response["id"]]
    record = records[0]
    usage = response["usage"]
    assert record.status == "completed"
    assert (record.input_tokens, record.output_tokens) == (usage["input_tokens"], usage["output_tokens"])
    assert usage["output_tokens"] == sum(f.usage.output_tokens or 0 for f in engine.finishes if f.usage)
    if RENDERER is not None:
        assert usage["input_tokens"] == sum(len(list(req.prompt.tokens())) for req in engine.requests if req.prompt)
        assert usage["input_tokens_details"]["cached_tokens"] == cached_expected
    assert [e.id for e in entries if isinstance(e, OpenEntry)] == [response["id"]]
    closes = [e.record for e in entries if isinstance(e, CloseEntry)]
    assert [c.response_id for c in closes] == [response["id"]] and closes[0].input_tokens == usage["input_tokens"]
    # Each append journals the grown input: a crash during the last engine call bills all of it.
    grown = [e for e in entries if isinstance(e, MarkEntry) and e.input_tokens is not None]
    assert len(grown) == 3
    if RENDERER is None:  # without a token log the grown input is known only from the engine's usage
        return
    assert grown[-1].input_tokens == usage["input_tokens"]
    assert grown[-1].cached_tokens == usage["input_tokens_details"]["cached_tokens"]
    opened = next(e for e in entries if isinstance(e, OpenEntry))
    recovered = recovered_record(opened, grown[-1])
    assert (recovered.status, recovered.input_tokens, recovered.cached_tokens) == (
        "cancelled", usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
    )
    assert recovered_record(opened, None).input_tokens == opened.input_tokens  # marks without input: the open's


async def test_a_continuation_after_an_appended_response_sees_the_whole_conversation(serve: Any) -> None:
    """The cached state holds the appended outputs where they came: the next turn continues it."""
    engine = RecordingEngine(calls=1)
    server = serve(backend=engine, session=APPEND_ON)
    async with ws_connect(server.ws_url) as ws:
        events, appended = await tool_loop(ws, store=False)
        first = events[-1]["response"]
        await ws.create(model=MODEL, input="again", tools=TOOLS, instructions=INSTRUCTIONS, previous_response_id=first["id"], store=False)
        events2 = await until(ws, *TERMINAL, "response.awaiting_input")
    assert events2[-1]["type"] == "response.completed"  # no append asked: a call ends the response
    last = engine.requests[-1]
    wanted = [{"role": "user", "content": "go"}, first["output"][0], *appended[0], first["output"][1], {"role": "user", "content": "again"}]
    items = decode_input(json.dumps(wanted).encode())
    assert [type(i).__name__ for i in last.conversation.items()] == [type(i).__name__ for i in items]
    if RENDERER is not None and last.prompt is not None:
        r = last.prompt.renderer
        assert list(last.prompt.tokens()) == list(r.prompt(r.render_full(INSTRUCTIONS, last.tools, items)))


# -- errors ---------------------------------------------------------------------------------------


async def test_append_is_refused_where_the_extension_is_off(serve: Any) -> None:
    """Off (the default): a create asking for it gets ``append_not_enabled``; a ``response.append``
    frame is the legacy event and is ignored (the connection goes on)."""
    server = serve(backend=RecordingEngine())
    async with ws_connect(server.ws_url) as ws:
        await ws.create(model=MODEL, input="go", tools=TOOLS, append=True)
        assert_error(await recv(ws), "append_not_enabled", "append")
        await ws.send(append("resp_x", outputs(["call_1"])))
        await ws.create(model=MODEL, input="go", tools=TOOLS)
        events = await until(ws, *TERMINAL)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"


async def test_append_over_http_is_refused(serve: Any) -> None:
    import httpx

    server = serve(backend=RecordingEngine(), session=APPEND_ON)
    with httpx.Client(base_url=server.http_url, timeout=15) as client:
        reply = client.post("/responses", json={"model": MODEL, "input": "go", "append": True})
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "append_not_enabled" and reply.json()["error"]["param"] == "append"


async def test_appends_that_do_not_answer_the_pending_calls_are_refused(serve: Any) -> None:
    engine = RecordingEngine(calls=1)
    server = serve(backend=engine, session=APPEND_ON)
    async with ws_connect(server.ws_url) as ws:
        await ws.send(append("resp_unknown", outputs(["call_1"])))
        assert_error(await recv(ws), "response_not_awaiting_input", "response_id")
        await ws.send({"type": "response.append", "input": []})
        assert_error(await recv(ws), "missing_required_parameter", "response_id")
        await ws.create(model=MODEL, input="go", tools=TOOLS, instructions=INSTRUCTIONS, append=True, stream_id="a")
        got = await until(ws, "response.awaiting_input")
        waiting = got[-1]
        rid, (call_id,) = waiting["response_id"], waiting["call_ids"]
        assert waiting["stream_id"] == "a"
        for items, param in (
            (outputs(["call_other"]), "input[0].call_id"),
            ([], "input"),
            ([*outputs([call_id]), *outputs([call_id])], "input[1].call_id"),
            ([{"role": "user", "content": "hi"}], "input[0]"),
        ):
            await ws.send(append(rid, items))
            assert_error(await recv(ws), "invalid_append_input", param, stream_id="a")
        await ws.send(append(rid, "a user message"))  # a string is a user message, as in response.create
        assert_error(await recv(ws), "invalid_append_input", "input[0]", stream_id="a")
        await ws.send(append(rid, 42))
        assert_error(await recv(ws), "invalid_type", "input", stream_id="a")
        await ws.send({**append(rid, outputs([call_id])), "extra": 1})
        bad = await recv(ws)
        assert bad["type"] == "error" and bad["error"]["code"] == "invalid_value" and "extra" in bad["error"]["message"]
        # The response still waits: a correct append finishes it.
        await ws.send(append(rid, outputs([call_id])))
        rest = await until(ws, *TERMINAL)
        assert rest[-1]["type"] == "response.completed" and rest[-1]["response"]["id"] == rid
        # Once it ended, the response takes no more input.
        await ws.send(append(rid, outputs([call_id])))
        assert_error(await recv(ws), "response_not_awaiting_input", "response_id")
    assert len(engine.requests) == 2


# -- disconnect while awaiting --------------------------------------------------------------------


async def test_a_disconnect_while_awaiting_input_bills_the_response_cancelled(serve: Any) -> None:
    """The client leaves while the response waits for tool output: the response is billed once,
    ``cancelled``, with the usage of the engine calls it made; no turn or engine stream is left."""
    engine = RecordingEngine(calls=3)
    records: list[UsageRecord] = []
    biller = Biller(CallableSink(records.extend), flush_interval=0.001)
    server = serve(backend=engine, session=APPEND_ON, billing=biller)
    async with ws_connect(server.ws_url) as ws:
        await ws.create(model=MODEL, input="go", tools=TOOLS, instructions=INSTRUCTIONS, append=True)
        first = await until(ws, "response.awaiting_input")
        await ws.send(append(first[-1]["response_id"], outputs(first[-1]["call_ids"])))
        await until(ws, "response.awaiting_input")
    server.stop()
    rid = first[0]["response"]["id"]
    assert [(r.response_id, r.status) for r in records] == [(rid, "cancelled")]
    assert records[0].output_tokens == sum(f.usage.output_tokens or 0 for f in engine.finishes if f.usage) > 0
    assert len(engine.requests) == 2 and engine.closed == 2


async def test_a_stored_appended_response_hydrates_with_its_outputs(serve: Any) -> None:
    """``store: true``: a continuation on another connection (no hot cache: hydrated from the
    store) renders the appended outputs where they came, as a full render of the conversation."""
    engine = RecordingEngine(calls=2)
    server = serve(backend=engine, session=APPEND_ON, hot_cache_bytes=0)
    async with ws_connect(server.ws_url) as ws:
        events, appended = await tool_loop(ws)
    first = events[-1]["response"]
    async with ws_connect(server.ws_url) as ws:
        await ws.create(model=MODEL, input="again", tools=TOOLS, instructions=INSTRUCTIONS, previous_response_id=first["id"])
        done = await until(ws, *TERMINAL)
    assert done[-1]["type"] == "response.completed", done[-1]
    out = first["output"]
    wanted = [{"role": "user", "content": "go"}, out[0], *appended[0], out[1], *appended[1], out[2], {"role": "user", "content": "again"}]
    items = decode_input(json.dumps(wanted).encode())
    last = engine.requests[-1]
    assert [type(i).__name__ for i in last.conversation.items()] == [type(i).__name__ for i in items]
    if RENDERER is not None and last.prompt is not None:
        r = last.prompt.renderer
        assert list(last.prompt.tokens()) == list(r.prompt(r.render_full(INSTRUCTIONS, last.tools, items)))


class BlockSecrets:
    """A blocking safety hook: flags any new item whose text contains ``secret``."""

    name = "secrets"
    phase: Phase = "before"

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def __call__(self, ctx: HookContext, new_items: Sequence[Item], state: Any) -> Verdict:
        self.seen.append(len(new_items))
        return Verdict(flagged="secret" in json.dumps([msgspec.to_builtins(i) for i in new_items]))


async def test_safety_hooks_see_appended_outputs_and_a_flag_ends_the_response(serve: Any) -> None:
    engine = RecordingEngine(calls=3)
    records: list[UsageRecord] = []
    hook = BlockSecrets()
    server = serve(backend=engine, session=APPEND_ON, hooks=[hook], billing=Biller(CallableSink(records.extend), flush_interval=0.001))
    async with ws_connect(server.ws_url) as ws:
        await ws.create(model=MODEL, input="go", tools=TOOLS, instructions=INSTRUCTIONS, append=True)
        waiting = (await until(ws, "response.awaiting_input"))[-1]
        await ws.send(append(waiting["response_id"], outputs(waiting["call_ids"])))
        waiting = (await until(ws, "response.awaiting_input"))[-1]
        await ws.send(append(waiting["response_id"], outputs(waiting["call_ids"], "the secret is")))
        done = (await until(ws, *TERMINAL))[-1]
        # The response ended after its second call, still open: a continuation answers it.
        second = waiting["call_ids"]
        clean = outputs(second, "redacted")
        await ws.create(model=MODEL, input=clean, tools=TOOLS, instructions=INSTRUCTIONS, previous_response_id=done["response"]["id"])
        more = await until(ws, *TERMINAL)
    server.stop()
    assert more[-1]["type"] == "response.completed", more[-1]
    last = engine.requests[-1]
    out = done["response"]["output"]
    first_outputs = [i for i in engine.requests[1].conversation.items() if isinstance(i, FunctionCallOutput)]
    wanted = [{"role": "user", "content": "go"}, out[0], msgspec.to_builtins(first_outputs[0]), out[1], *clean]
    items = decode_input(json.dumps(wanted).encode())
    assert [type(i).__name__ for i in last.conversation.items()] == [type(i).__name__ for i in items]
    if RENDERER is not None and last.prompt is not None:
        r = last.prompt.renderer
        assert list(last.prompt.tokens()) == list(r.prompt(r.render_full(INSTRUCTIONS, last.tools, items)))
    assert hook.seen == [1, 1, 1, 1]  # the input, each append, the continuation: never the history
    # Like a flag raised during generation: the response ends incomplete (content_filter), billed.
    assert done["type"] == "response.incomplete", done
    assert done["response"]["incomplete_details"] == {"reason": "content_filter"}
    assert [i["type"] for i in done["response"]["output"]] == ["function_call", "function_call"]
    assert len(engine.requests) == 3  # the flagged output never reached the engine
    assert (records[0].response_id, records[0].status) == (done["response"]["id"], "incomplete")
    assert records[0].output_tokens == done["response"]["usage"]["output_tokens"] > 0


class CountAlongside:
    """An incremental alongside hook: its state counts the items it has seen."""

    name = "counter"
    phase: Phase = "alongside"

    def __init__(self) -> None:
        self.calls: list[tuple[int, Any]] = []

    async def __call__(self, ctx: HookContext, new_items: Sequence[Item], state: Any) -> Verdict:
        self.calls.append((len(new_items), state))
        return Verdict(state=(state or 0) + len(new_items))


async def test_alongside_hooks_go_on_from_their_state_over_the_appended_items(serve: Any) -> None:
    """Incremental = full: each engine call's alongside hooks see only the appended items, with
    the state they carried from the call before (not the history, not the parent's state again)."""
    hook = CountAlongside()
    server = serve(backend=RecordingEngine(calls=2), session=APPEND_ON, hooks=[hook])
    async with ws_connect(server.ws_url) as ws:
        events, _ = await tool_loop(ws, store=False)
        first = events[-1]["response"]
        await ws.create(model=MODEL, input="next", tools=TOOLS, instructions=INSTRUCTIONS, previous_response_id=first["id"], store=False)
        await until(ws, *TERMINAL)
    assert hook.calls == [(1, None), (1, 1), (1, 2), (1, 3)]
