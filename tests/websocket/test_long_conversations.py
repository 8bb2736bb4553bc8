"""Long conversations over WebSocket: ``truncation: "auto"`` and ``context_management``
compaction keep a 300-turn agent loop inside a small context window, every event validated
strictly. After every cut or compaction the engine's prompt is exactly a full render of what the
conversation holds now (the fidelity oracle on these paths), and the turns after it append again
(counted in items rendered)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from backends import RecordingBackend, identity
from wsclient import RENDERER, WS, ws_connect

from responses_cache.conversation.compaction import SUMMARY_PREFIX, Compaction, expand, open_items
from responses_cache.conversation.sealing import Sealer, new_key
from responses_cache.protocol.items import CompactionItem, HostedItem, Message
from responses_cache.protocol.request import decode_input
from responses_cache.tokens import BaseRenderer, get_renderer

pytestmark = pytest.mark.skipif(RENDERER is None, reason="needs the tokens package")

TOOLS = [
    {
        "type": "function",
        "name": "run",
        "description": "Run a step.",
        "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]},
    }
]
INSTRUCTIONS = "You are a careful coding agent."
WINDOW = 1200
TURNS = 300
_tags = itertools.count()


class Usage:
    """A billing sink that keeps every record (``submit`` is what the pipeline calls)."""

    def __init__(self) -> None:
        self.records: list[Any] = []

    def submit(self, record: Any) -> None:
        self.records.append(record)


def _renderer() -> BaseRenderer:
    assert RENDERER is not None
    r = get_renderer(RENDERER)
    assert isinstance(r, BaseRenderer)
    return r


def _assert_prompt_is_full_render(call: Any, renderer: BaseRenderer) -> None:
    """The oracle: the engine's prompt equals a full render of the conversation it was given."""
    assert call.request.prompt is not None
    full = renderer.render_full(INSTRUCTIONS, call.request.tools, expand(call.items))
    assert list(call.request.prompt.tokens()) == list(renderer.prompt(full))


async def _agent_loop(ws: WS, backend: RecordingBackend, renderer: BaseRenderer, **options: Any) -> list[dict[str, Any]]:
    """``TURNS`` turns of a tool loop chained by ``previous_response_id``: odd turns a user asks
    (the model calls the tool), even turns the tool's output comes back (the model answers).
    Returns, per turn, the completed response and the items rendered for it."""
    turns: list[dict[str, Any]] = []
    previous: str | None = None
    pending_call: str | None = None
    for n in range(TURNS):
        tag = f"t{next(_tags)}"
        if pending_call is None:
            new: list[dict[str, Any]] = [
                {"type": "message", "role": "user", "content": f"step {n}: please look at module_{n}.py and fix it"}
            ]
            metadata = {"tag": tag, "call": "run", "args": json.dumps({"step": n}), "call_id": f"call_{n}"}
        else:
            new = [{"type": "function_call_output", "call_id": pending_call, "output": f"module_{n} patched, 3 tests pass"}]
            metadata = {"tag": tag, "text": f"Done with step {n}; the tests pass now."}
        before = renderer.stats.items_rendered
        response = await ws.ok(
            input=new, previous_response_id=previous, instructions=INSTRUCTIONS, tools=TOOLS, metadata=metadata,
            max_output_tokens=64, **options,
        )
        rendered = renderer.stats.items_rendered - before  # counted before the oracle renders
        call = backend.by_tag(tag)
        _assert_prompt_is_full_render(call, renderer)
        calls = [o for o in response["output"] if o["type"] == "function_call"]
        pending_call = calls[0]["call_id"] if calls else None
        previous = response["id"]
        turns.append({"response": response, "rendered": rendered, "call": call})
    return turns


async def test_truncation_keeps_a_300_turn_loop_in_a_small_window(serve: Any, backend: RecordingBackend) -> None:
    server = serve(context_window=WINDOW)
    renderer = _renderer()
    async with ws_connect(server.ws_url) as ws:
        turns = await _agent_loop(ws, backend, renderer, truncation="auto")
    assert all(t["response"]["status"] == "completed" for t in turns)
    cut = [i for i, t in enumerate(turns) if "truncation_details" in t["response"]]
    assert cut, "the conversation never outgrew the window"
    for i in cut:
        details = turns[i]["response"]["truncation_details"]
        assert details["dropped_items"] >= 1 and details["dropped_tokens"] > 0
        assert turns[i]["response"]["truncation"] == "auto"
        assert turns[i]["response"]["usage"]["input_tokens"] + 64 <= WINDOW
        # What the engine got is the end of the conversation, whole items, no output without its call.
        seen = turns[i]["call"].items
        called = {item.call_id for item in seen if getattr(item, "type", None) is None and hasattr(item, "arguments")}
        assert all(item.call_id in called for item in seen if type(item).__name__ == "FunctionCallOutput")
    # Between two cuts every turn appends: it renders only its new input and the last output.
    incremental = [t["rendered"] for i, t in enumerate(turns) if i not in cut and i > 0]
    assert incremental and max(incremental) <= 2, incremental
    # The headroom leaves room for several appending turns after each cut.
    assert len(cut) <= TURNS // 4, len(cut)


async def test_without_truncation_the_window_is_a_hard_limit(serve: Any, backend: RecordingBackend) -> None:
    server = serve(context_window=WINDOW)
    async with ws_connect(server.ws_url) as ws:
        previous = None
        for n in range(TURNS):
            await ws.create(
                input=f"step {n}: please look at module_{n}.py and fix it", previous_response_id=previous,
                instructions=INSTRUCTIONS, metadata={"text": "Looked at it; it is fine now, nothing else to do."},
            )
            events = await ws.finish()
            if events[-1]["type"] == "error":
                assert events[-1]["error"]["code"] == "context_length_exceeded"
                return
            previous = events[-1]["response"]["id"]
    pytest.fail("a conversation past the window was accepted without truncation")


async def test_compaction_keeps_a_300_turn_loop_in_a_small_window(serve: Any, backend: RecordingBackend) -> None:
    usage = Usage()
    server = serve(context_window=WINDOW, sealer=Sealer.from_text(new_key()), billing=usage)
    renderer = _renderer()
    threshold = WINDOW // 2
    async with ws_connect(server.ws_url) as ws:
        turns = await _agent_loop(
            ws, backend, renderer, context_management=[{"type": "compaction", "compact_threshold": threshold}]
        )
        log = ws.log
    compacted = [i for i, t in enumerate(turns) if t["response"]["output"][0]["type"] == "compaction"]
    assert compacted, "the conversation never passed the threshold"
    summaries = [c for c in backend.calls if c.request.tool_choice == "none"]
    assert len(summaries) == len(compacted)
    for i in compacted:
        response = turns[i]["response"]
        item = response["output"][0]
        assert set(item) == {"type", "id", "encrypted_content"} and item["encrypted_content"].startswith("rcs1.")
        # The response was generated from the compacted log: the summary alone.
        seen = turns[i]["call"].items
        assert len(seen) == 1 and isinstance(seen[0], Compaction) and seen[0].id == item["id"]
        assert response["usage"]["input_tokens"] < threshold
        stream = [e for e in log if e.get("response", {}).get("id") == response["id"] or e.get("item_id") == item["id"]]
        assert any(e["type"] == "response.compaction.compacting" and e["output_index"] == 0 for e in stream)
    # Compacting turns render the summary; every other turn appends its new input and last output.
    incremental = [t["rendered"] for i, t in enumerate(turns) if i not in compacted and i > 0]
    assert incremental and max(incremental) <= 2, incremental
    # Billed apart: one record per response and one per compaction, under the compaction's id.
    by_id = {r.response_id: r for r in usage.records}
    assert len(usage.records) == TURNS + len(compacted)
    for i in compacted:
        record = by_id[turns[i]["response"]["output"][0]["id"]]
        assert record.input_tokens > threshold and record.output_tokens > 0


async def test_a_resend_without_the_items_before_the_compaction_matches_the_cache(
    serve: Any, backend: RecordingBackend
) -> None:
    """A ``store: false`` client sending its whole input: after an automatic compaction it may
    drop the items before the compaction item (the Responses API's advice) or keep them; both
    resends continue from the cached log (the engine sees the same prompt, and only the new
    items are rendered)."""
    sealer = Sealer.from_text(new_key())
    server = serve(context_window=WINDOW, sealer=sealer)
    renderer = _renderer()
    history: list[dict[str, Any]] = []
    body: dict[str, Any] = {
        "instructions": INSTRUCTIONS, "tools": TOOLS, "store": False,
        "context_management": [{"type": "compaction", "compact_threshold": 300}],
    }
    async with ws_connect(server.ws_url) as ws:
        response: dict[str, Any] = {}
        for n in range(12):
            history.append({"type": "message", "role": "user", "content": f"step {n}: fix module_{n}.py " * 3})
            response = await ws.ok(input=history, metadata={"text": f"Step {n} is done."}, **body)
            history.extend(response["output"])
            if response["output"][0]["type"] == "compaction":
                break
        assert response["output"][0]["type"] == "compaction", "no compaction happened"
        kept_from = history.index(response["output"][0])
        references = []
        for resend in (history[kept_from:], history):  # dropped, then kept (after another turn)
            tag = f"t{next(_tags)}"
            resend = [*resend, {"type": "message", "role": "user", "content": f"and now {tag}"}]
            before = renderer.stats.items_rendered
            answer = await ws.ok(input=resend, metadata={"tag": tag, "text": "ok"}, **{**body, "context_management": None})
            assert renderer.stats.items_rendered - before <= 2  # the new message and the last output
            assert answer["usage"]["input_tokens_details"]["cached_tokens"] > 0
            seen = backend.by_tag(tag).items
            references.append(seen)
            kept = decode_input(json.dumps(resend[resend.index(response["output"][0]) :]).encode())
            assert [identity(i) for i in seen] == [identity(i) for i in open_items(sealer, "default", kept)]
            history = [*resend, *answer["output"]]


async def test_a_compaction_trigger_compacts_now(serve: Any, backend: RecordingBackend) -> None:
    """``compaction_trigger`` as the final input item (the SDK's ``CompactionTrigger``): the
    response compacts before answering, whatever the size; anywhere else it is refused."""
    server = serve(sealer=Sealer.from_text(new_key()))
    renderer = _renderer()
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(input="look at parser.py", instructions=INSTRUCTIONS, metadata={"text": "It has a bug."})
        tag = f"t{next(_tags)}"
        second = await ws.ok(
            input=[{"type": "message", "role": "user", "content": "fix it"}, {"type": "compaction_trigger"}],
            previous_response_id=first["id"], instructions=INSTRUCTIONS, metadata={"tag": tag, "text": "Fixed."},
        )
        assert [o["type"] for o in second["output"]] == ["compaction", "message"]
        call = backend.by_tag(tag)
        assert len(call.items) == 1 and isinstance(call.items[0], Compaction)
        _assert_prompt_is_full_render(call, renderer)
        error = await ws.error(
            input=[{"type": "compaction_trigger"}, {"type": "message", "role": "user", "content": "go"}],
            previous_response_id=second["id"], instructions=INSTRUCTIONS,
        )
        assert error["error"]["param"] == "input[0].type" and error["error"]["code"] == "invalid_value"


async def test_a_message_based_backend_sees_the_summary_as_a_message(serve: Any, backend: RecordingBackend) -> None:
    """Without a renderer (a chat-style engine) compaction still works: the summary request and
    every later request carry the summary as a user message, never the sealed item."""
    server = serve(renderer=None, sealer=Sealer.from_text(new_key()))
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(input="look at parser.py", metadata={"text": "It has a bug."})
        second = await ws.ok(
            input=[{"type": "message", "role": "user", "content": "fix it"}, {"type": "compaction_trigger"}],
            previous_response_id=first["id"], metadata={"text": "Fixed."},
        )
        tag = f"t{next(_tags)}"
        await ws.ok(input="and now?", previous_response_id=second["id"], metadata={"tag": tag})
    seen = backend.by_tag(tag).items
    assert not any(isinstance(i, (Compaction, HostedItem, CompactionItem)) for i in seen)
    summary = seen[0]
    assert isinstance(summary, Message) and str(summary.content).startswith(SUMMARY_PREFIX)
    assert [type(i).__name__ for i in seen] == ["Message", "Message", "Message"]


async def test_a_tampered_compaction_item_is_an_error_event(serve: Any, backend: RecordingBackend) -> None:
    server = serve(sealer=Sealer.from_text(new_key()))
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(input="look at parser.py", metadata={"text": "It has a bug."})
        second = await ws.ok(input=[{"type": "compaction_trigger"}], previous_response_id=first["id"])
        item = second["output"][0]
        blob = item["encrypted_content"]
        tampered = {**item, "encrypted_content": blob[:10] + ("A" if blob[10] != "A" else "B") + blob[11:]}
        error = await ws.error(input=[tampered, {"type": "message", "role": "user", "content": "go on"}], store=False)
        assert error["status"] == 400
        assert error["error"]["code"] == "invalid_encrypted_content"
        assert error["error"]["param"] == "input[0].encrypted_content" and item["id"] in error["error"]["message"]
        # The socket stays open, and the untouched item still works.
        ok = await ws.ok(input=[item, {"type": "message", "role": "user", "content": "go on"}], store=False)
        assert ok["status"] == "completed"


async def test_a_full_resend_after_a_cut_matches_the_cache(serve: Any, backend: RecordingBackend) -> None:
    """A ``store: false`` client resending its whole input with ``truncation: "auto"``: after a
    cut it still sends the dropped items; it is matched from where the cut fell (the kept
    developer message ahead), so the turns between cuts append, and the engine gets the cut
    conversation plus the new items."""
    server = serve(context_window=WINDOW)
    renderer = _renderer()
    history: list[dict[str, Any]] = [{"type": "message", "role": "developer", "content": "Use tabs, never spaces."}]
    cuts = appended = 0
    async with ws_connect(server.ws_url) as ws:
        for n in range(80):
            tag = f"t{next(_tags)}"
            history.append({"type": "message", "role": "user", "content": f"step {n}: fix module_{n}.py please"})
            before = renderer.stats.items_rendered
            response = await ws.ok(
                input=history, store=False, truncation="auto", instructions=INSTRUCTIONS, max_output_tokens=64,
                metadata={"tag": tag, "text": f"Step {n} is done; module_{n}.py passes its tests."},
            )
            rendered = renderer.stats.items_rendered - before
            call = backend.by_tag(tag)
            _assert_prompt_is_full_render(call, renderer)
            seen = [identity(i) for i in call.items]
            assert seen[0] == identity(decode_input(json.dumps(history[:1]).encode())[0])  # the developer message
            client = [identity(i) for i in decode_input(json.dumps(history).encode())]
            assert seen[1:] == client[len(client) - len(seen) + 1 :]  # then the end of the conversation
            if "truncation_details" in response:
                cuts += 1
            elif n:
                appended += 1
                assert rendered <= 2, (n, rendered)  # the new message and the last answer
            history.extend(response["output"])
    assert cuts >= 3 and appended >= 60
