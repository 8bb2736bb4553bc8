"""Usage on the wire and in the usage records: every response that ran is billed once, a failed
one included, with the usage its client saw; ``cached_tokens`` is the engine's count for a
message-based backend and, with a renderer, the prefix the prompt really shares with the
parent's token log (which is less than that log when the template rewrote earlier turns)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from backends import RecordingBackend, until
from wsclient import check_stream, ws_connect

from responses_cache import Biller, CallableSink, UsageRecord
from responses_cache.backends.base import EngineUsage, Finish, ReasoningDelta, TextDelta
from responses_cache.protocol.items import Message, Reasoning, ReasoningText
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.testing import RecordingBackend as Recorder
from responses_cache.testing import ScriptedBackend
from responses_cache.tokens import get_renderer
from tests.tokens.hf_assets import build_tokenizer_dir


async def test_a_failed_response_is_billed_once_with_the_usage_it_reported(serve: Any, backend: RecordingBackend) -> None:
    """Invariant 6 for the failures after ``response.created``: an engine error and an engine
    crash each end the response ``failed`` and each give exactly one usage record, status
    ``failed``, carrying the usage the ``response.failed`` event reported."""
    records: list[UsageRecord] = []
    server = serve(billing=Biller(CallableSink(records.extend), flush_interval=0.001))
    failed: dict[str, dict[str, Any]] = {}
    async with ws_connect(server.ws_url) as ws:
        for meta in ({"fail_after": "2", "text": "a b c d"}, {"crash": "1", "text": "a b"}):
            response = check_stream(await ws.turn(input="x", metadata=meta))
            assert response["status"] == "failed"
            failed[response["id"]] = response
        completed = await ws.ok(input="still fine")
    await until(lambda: len(records) == 3, "three usage records")
    by_id = {r.response_id: r for r in records}
    assert set(by_id) == {*failed, completed["id"]}
    for response_id, response in failed.items():
        record, usage = by_id[response_id], response["usage"]
        assert record.status == "failed"
        assert record.input_tokens == usage["input_tokens"] and record.output_tokens == usage["output_tokens"]
    assert [by_id[i].output_tokens for i in failed] == [2, 1]  # what streamed before each failure


async def test_a_message_backend_reports_the_engines_usage(serve: Any) -> None:
    """Without a renderer the server has no prompt of its own to count: ``input_tokens``,
    ``cached_tokens`` and ``output_tokens`` are what the engine reported (``cached_tokens`` never
    above ``input_tokens``), on the wire and in the usage record."""
    records: list[UsageRecord] = []
    engine = ScriptedBackend(
        [
            [TextDelta("ok"), Finish("stop", EngineUsage(prompt_tokens=1200, cached_tokens=1100, output_tokens=42))],
            [TextDelta("ok"), Finish("stop", EngineUsage(prompt_tokens=1300, cached_tokens=1400, output_tokens=7))],
        ]
    )
    server = serve(backend=engine, renderer=None, billing=Biller(CallableSink(records.extend), flush_interval=0.001))
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(model="sim-1", input="hi", store=False)
        second = await ws.ok(model="sim-1", input="more", previous_response_id=first["id"], store=False)
    usages = [(r["usage"]["input_tokens"], r["usage"]["input_tokens_details"]["cached_tokens"], r["usage"]["output_tokens"]) for r in (first, second)]
    assert usages == [(1200, 1100, 42), (1300, 1300, 7)]
    await until(lambda: len(records) == 2, "two usage records")
    by_id = {r.response_id: (r.input_tokens, r.cached_tokens, r.output_tokens) for r in records}
    assert [by_id[first["id"]], by_id[second["id"]]] == usages


async def test_cached_tokens_stop_where_a_template_rewrote_the_parents_turn(serve: Any, tmp_path: pathlib.Path) -> None:
    """A Qwen-style template drops an answer's reasoning once a later user message exists, so the
    continuation's prompt leaves the parent's token log inside that answer: ``cached_tokens`` is
    the prefix the two really share (what the engine can reuse), not the parent log's length."""
    pytest.importorskip("tokenizers")
    model = build_tokenizer_dir("qwen", tmp_path / "qwen")
    engine = Recorder(ScriptedBackend([[ReasoningDelta("add the two numbers"), TextDelta("4"), Finish("stop")]]))
    server = serve(backend=engine, renderer=f"hf:{model}")
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(model="sim-1", input="2+2?", store=False)
        second = await ws.ok(model="sim-1", input="and 3+3?", previous_response_id=first["id"], store=False)
    renderer = get_renderer(f"hf:{model}")
    question = Message(role="user", content="2+2?")
    answer = [Reasoning(summary=[], content=[ReasoningText("add the two numbers")]), Message(role="assistant", content="4")]
    parent = list(renderer.render_full(None, EMPTY_TOOLS, [question, *answer]).tokens())
    prompt = engine.requests[1].prompt
    assert prompt is not None
    ids = list(prompt.tokens())
    shared = next((i for i, (x, y) in enumerate(zip(ids, parent, strict=False)) if x != y), min(len(ids), len(parent)))
    assert 0 < shared < len(parent)  # the rewrite is inside the parent's log
    assert second["usage"]["input_tokens_details"]["cached_tokens"] == shared
    assert second["usage"]["input_tokens"] == len(prompt.tokens())
