"""Request semantics of the vLLM/SGLang backend, driven directly (no server in front):
tool_choice, parallel_tool_calls, a template that opens ``<think>``, the per-tenant salt, the
routing headers, and rendezvous placement."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from array import array
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from responses_cache_vllm import EngineBackend, Replicas, rendezvous

from responses_cache import (
    Finish,
    GenerationRequest,
    Prompt,
    ReasoningDelta,
    TextDelta,
    ToolCallStart,
    get_renderer,
)
from responses_cache.conversation import EMPTY
from responses_cache.protocol.tools import parse_tools
from responses_cache.testing import Behaviour, FakeVllm
from responses_cache.tokens.chatml import ChatMLRenderer

TOOLS = parse_tools(json.dumps([{"type": "function", "name": "exec_command",
                                 "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]).encode())


class ThinkingChatML(ChatMLRenderer):
    """A ChatML template whose generation prompt opens ``<think>`` (Qwen3-style thinking)."""

    def _generation_prompt(self) -> array[int]:
        out = super()._generation_prompt()
        out.extend(self._enc("<think>\n"))
        return out


def _request(renderer: Any, **fields: Any) -> GenerationRequest:
    log = renderer.begin("Be brief.", TOOLS)
    base = GenerationRequest(
        response_id="resp_test1", model="m", instructions="Be brief.", tools=TOOLS, conversation=EMPTY,
        prompt=Prompt(log, renderer), affinity_key="tenant-a/conv-1/0",
    )
    return dataclasses.replace(base, **fields)


def _run(backend: EngineBackend, request: GenerationRequest) -> list[Any]:
    async def go() -> list[Any]:
        try:
            return [e async for e in backend.generate(request)]
        finally:
            await backend.aclose()

    return asyncio.run(go())


def _summary(events: Sequence[Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for e in events:
        if isinstance(e, ToolCallStart):
            out.append(("call", e.name))
            continue
        if isinstance(e, Finish):
            continue
        kind, text = (("reasoning", e.text) if isinstance(e, ReasoningDelta) else ("text", e.text)
                      if isinstance(e, TextDelta) else ("args", e.arguments))
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def _backend(live: Any, engine: FakeVllm, **options: Any) -> EngineBackend:
    url = f"http://127.0.0.1:{live(engine.app()).port}"
    return EngineBackend(url, model=engine.model, **options)


def test_chatml_template_opening_think_parses_reasoning(responses_cache_server_factory: Any) -> None:
    renderer = ThinkingChatML()
    engine = FakeVllm(renderer.encoding, ["plan it\n</think>\n\nSure.<|im_end|>"])
    events = _run(_backend(responses_cache_server_factory, engine), _request(renderer))
    assert _summary(events) == [("reasoning", "plan it\n"), ("text", "\n\nSure.")]
    assert isinstance(events[-1], Finish) and events[-1].token_ids is not None
    assert events[-1].token_ids[-1] == renderer.encoding.encode_single_token("<|im_end|>")


def test_named_tool_choice_starts_the_call_in_the_prompt(responses_cache_server_factory: Any) -> None:
    renderer = get_renderer("harmony")
    engine = FakeVllm(renderer.encoding, ['{"cmd": "ls"}<|call|>'])
    request = _request(renderer, tool_choice={"type": "function", "name": "exec_command"})
    events = _run(_backend(responses_cache_server_factory, engine), request)
    assert _summary(events) == [("call", "exec_command"), ("args", '{"cmd": "ls"}')]
    prefill = renderer.encoding.encode("<|channel|>commentary to=functions.exec_command <|constrain|>json<|message|>",
                                       allowed_special="all")
    sent = engine.generation_requests()[0].body["token_ids"]
    assert sent == [*request.prompt.tokens(), *prefill]  # type: ignore[union-attr]
    finish = events[-1]
    assert isinstance(finish, Finish) and list(finish.token_ids or [])[: len(prefill)] == prefill


def test_required_tool_choice_forces_a_call(responses_cache_server_factory: Any) -> None:
    renderer = get_renderer("chatml")
    engine = FakeVllm(renderer.encoding, ['exec_command", "arguments": {"cmd": "pwd"}}\n</tool_call><|im_end|>'])
    events = _run(_backend(responses_cache_server_factory, engine), _request(renderer, tool_choice="required"))
    assert _summary(events) == [("call", "exec_command"), ("args", '{"cmd": "pwd"}')]


def test_tool_choice_none_ends_the_answer_where_a_call_would_start(responses_cache_server_factory: Any) -> None:
    # A token prompt cannot forbid a call up front: the engine's stream is closed at the first
    # call the model starts, and what it wrote before stays the answer (no call reaches the client).
    renderer = get_renderer("harmony")
    answer = ("<|channel|>final<|message|>Let me look.<|end|><|start|>assistant<|channel|>commentary "
              'to=functions.exec_command <|constrain|>json<|message|>{"cmd": "ls"}<|call|>')
    engine = FakeVllm(renderer.encoding, [answer, answer])
    # The engine stalls a few tokens into the call: only closing the stream ends it.
    stall = len(renderer.encoding.encode(answer[: answer.index("<|message|>{") + 12], allowed_special="all"))
    engine.behaviours = [Behaviour(chunk_tokens=1, hang_after=stall)]
    events = _run(_backend(responses_cache_server_factory, engine), _request(renderer, tool_choice="none"))
    assert _summary(events) == [("text", "Let me look.")]
    assert isinstance(events[-1], Finish) and events[-1].reason == "stop" and events[-1].token_ids is None
    deadline = time.monotonic() + 10
    while engine.closed_early == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.closed_early == 1
    # With "auto" the same answer's call goes through.
    auto = _run(_backend(responses_cache_server_factory, engine), _request(renderer))
    assert [e.name for e in auto if isinstance(e, ToolCallStart)] == ["exec_command"]


def test_parallel_tool_calls_false_keeps_one_call_and_stops_the_engine(responses_cache_server_factory: Any) -> None:
    renderer = get_renderer("chatml")
    two_calls = ('<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
                 '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "pwd"}}\n</tool_call>\n'
                 + "and some more text to come after that " * 3 + "<|im_end|>")
    engine = FakeVllm(renderer.encoding, [two_calls, two_calls])
    # The engine stalls a few tokens after the second call: only closing the stream ends it.
    stall = len(renderer.encoding.encode(two_calls[: two_calls.rindex("</tool_call>") + 20], allowed_special="all"))
    engine.behaviours = [Behaviour(chunk_tokens=1, hang_after=stall)]
    events = _run(_backend(responses_cache_server_factory, engine), _request(renderer, parallel_tool_calls=False))
    assert _summary(events) == [("call", "exec_command"), ("args", '{"cmd": "ls"}'), ("text", "\n")]
    assert isinstance(events[-1], Finish) and events[-1].token_ids is None  # rendered from the one call
    deadline = time.monotonic() + 10
    while engine.closed_early == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.closed_early == 1
    both = _run(_backend(responses_cache_server_factory, engine), _request(renderer, parallel_tool_calls=True))
    assert [e.name for e in both if isinstance(e, ToolCallStart)] == ["exec_command", "exec_command"]


def test_cache_salt_is_per_tenant_unguessable_and_overridable(responses_cache_server_factory: Any) -> None:
    renderer = get_renderer("harmony")
    engine = FakeVllm(renderer.encoding, ["<|channel|>final<|message|>ok<|return|>"])
    url = f"http://127.0.0.1:{responses_cache_server_factory(engine.app()).port}"
    cached: list[int | None] = []
    for tenant, salt in (("acme", None), ("acme", None), ("globex", None), ("acme", "explicit-salt"), ("", None)):
        backend = EngineBackend(url, model=engine.model, salt_key="k" * 32)
        finish = _run(backend, _request(renderer, tenant=tenant, cache_salt=salt))[-1]
        assert isinstance(finish, Finish) and finish.usage is not None
        cached.append(finish.usage.cached_tokens)
    salts = [r.body.get("cache_salt") for r in engine.generation_requests()]
    assert salts[0] == salts[1] and salts[0] != salts[2] and salts[3] == "explicit-salt" and salts[4] is None
    assert salts[0] is not None and "acme" not in salts[0] and len(salts[0]) == 43  # 256 bits, base64url
    other_key = EngineBackend(url, model=engine.model, salt_key="j" * 32)
    assert other_key.cache_salt(_request(renderer, tenant="acme")) != salts[0]
    # The engine partitions its prefix cache by salt: the same tenant's second identical prompt is
    # a hit; another tenant's (or another salt's) identical prompt is a miss.
    assert cached[1] is not None and cached[1] > 0
    assert not any(cached[i] for i in (0, 2, 3, 4))  # reported as 0, or not at all
    assert engine.unknown_fields == []


def test_routing_headers_follow_the_conversation_not_the_tenant(responses_cache_server_factory: Any) -> None:
    renderer = get_renderer("harmony")
    backend = EngineBackend("http://127.0.0.1:9", model="m", data_parallel_size=4)
    one = backend.routing(_request(renderer, affinity_key="acme/conv-1/0"))
    again = backend.routing(_request(renderer, affinity_key="acme/conv-1/0", response_id="resp_2"))
    other = backend.routing(_request(renderer, affinity_key="acme/conv-2/0"))
    assert one["X-SMG-Routing-Key"] == again["X-SMG-Routing-Key"] == one["X-Session-ID"]
    assert one["X-data-parallel-rank"] == again["X-data-parallel-rank"] and 0 <= int(one["X-data-parallel-rank"]) < 4
    assert other["X-SMG-Routing-Key"] != one["X-SMG-Routing-Key"]
    assert "acme" not in one["X-SMG-Routing-Key"] and again["X-Request-Id"] == "resp_2"
    assert "X-data-parallel-rank" not in EngineBackend("http://127.0.0.1:9", model="m").routing(_request(renderer))


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 8), st.lists(st.text(min_size=1, max_size=12), min_size=50, max_size=200, unique=True))
def test_adding_a_replica_moves_only_its_share(n: int, keys: list[str]) -> None:
    before = [f"http://gpu-{i}:8000" for i in range(n)]
    after = [*before, "http://gpu-new:8000"]
    moved = [k for k in keys if rendezvous(k, before)[0] != rendezvous(k, after)[0]]
    # Every key that moves, moves to the new replica (nothing reshuffles among the old ones).
    assert all(rendezvous(k, after)[0] == "http://gpu-new:8000" for k in moved)


@pytest.mark.parametrize("n", range(2, 9))
def test_a_new_replica_takes_its_share(n: int) -> None:
    """... and it does take about 1/(n+1) of them: a placement that never picks the new replica
    moves nothing and passes the property above. (Fixed keys: the hash is deterministic.)"""
    keys = [f"tenant-{i % 7}/conv-{i}/0" for i in range(3000)]
    before = [f"http://gpu-{i}:8000" for i in range(n)]
    after = [*before, "http://gpu-new:8000"]
    moved = sum(1 for k in keys if rendezvous(k, before)[0] != rendezvous(k, after)[0])
    share = len(keys) / (n + 1)
    assert 0.7 * share < moved < 1.3 * share


def test_rendezvous_spreads_keys_and_fails_over_to_the_next_ranked() -> None:
    now = [0.0]
    replicas = Replicas([f"http://gpu-{i}:8000" for i in range(4)], cooldown=5, clock=lambda: now[0])
    keys = [f"conv-{i}" for i in range(2000)]
    owners = [replicas.ranked(k)[0] for k in keys]
    assert all(300 < owners.count(u) < 700 for u in replicas.urls)  # about 500 each
    down = owners[0]
    replicas.mark_down(down)
    for key, owner in zip(keys, owners, strict=True):
        ranked = replicas.ranked(key)
        assert ranked[0] == (owner if owner != down else rendezvous(key, replicas.urls)[1])
        assert ranked[-1] == down
    now[0] = 6.0  # the cooldown is over: conversations return to their owner
    assert [replicas.ranked(k)[0] for k in keys] == owners


class _WatchedTransport(httpx.AsyncHTTPTransport):
    """Counts the engine responses whose streams are still open."""

    def __init__(self) -> None:
        super().__init__()
        self.open = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.url.path != "/inference/v1/generate":
            return response
        self.open += 1
        stream, watcher = response.stream, self

        class Watched(httpx.AsyncByteStream):
            async def __aiter__(self) -> Any:
                async for chunk in stream:  # type: ignore[union-attr]
                    yield chunk

            async def aclose(self) -> None:
                watcher.open -= 1
                await stream.aclose()  # type: ignore[union-attr]

        return httpx.Response(response.status_code, headers=response.headers, stream=Watched(), request=request,
                              extensions=response.extensions)


def test_closing_a_generation_closes_the_engine_stream_at_once(responses_cache_server_factory: Any) -> None:
    # What steering and a client leaving do: the pipeline closes the backend's generator, and the
    # engine's HTTP stream must be closed by the time that returns (its request aborted), not
    # whenever the garbage collector finalizes the generators nested inside.
    renderer = get_renderer("harmony")
    engine = FakeVllm(renderer.encoding, ["<|channel|>final<|message|>" + "word " * 200 + "<|return|>"])
    engine.default = Behaviour(chunk_tokens=1, hang_after=20)
    transport = _WatchedTransport()
    backend = _backend(responses_cache_server_factory, engine, template="harmony", transport=transport)

    async def run() -> int:
        generation = backend.generate(_request(renderer))
        await generation.__anext__()  # the tokens streamed before the hang may come as one delta
        await generation.aclose()
        open_after_close = transport.open
        await backend.aclose()
        return open_after_close

    assert asyncio.run(run()) == 0


def test_tokens_that_arrive_together_are_one_delta(responses_cache_server_factory: Any) -> None:
    # While the turn is busy, the engine's next chunks queue up; they are decoded, parsed and
    # yielded as one delta (one event, one frame to the client) instead of one per token.
    renderer = ChatMLRenderer()
    engine = FakeVllm(renderer.encoding, ["word " * 200 + "<|im_end|>"])
    engine.default = Behaviour(chunk_tokens=1)
    backend = _backend(responses_cache_server_factory, engine)

    async def run() -> list[Any]:
        generation = backend.generate(_request(renderer))
        try:
            first = await generation.__anext__()
            await asyncio.sleep(0.5)  # busy: the engine streams the other ~200 chunks meanwhile
            return [first, *[event async for event in generation]]
        finally:
            await backend.aclose()

    events = asyncio.run(run())
    deltas = [event for event in events if isinstance(event, TextDelta)]
    assert "".join(delta.text for delta in deltas) == "word " * 200
    assert len(deltas) <= 3  # one per chunk was 200


def test_a_token_that_arrives_alone_is_yielded_before_the_next_is_sampled(responses_cache_server_factory: Any) -> None:
    # Nothing waits for a batch to fill: the engine sends its next chunk only after the turn has
    # the previous one, and each comes out on its own.
    renderer = ChatMLRenderer()
    engine = FakeVllm(renderer.encoding, ["one two three four<|im_end|>"])
    gate = threading.Semaphore(0)
    engine.default = Behaviour(chunk_tokens=1, hang_after=1, gate=gate)
    backend = _backend(responses_cache_server_factory, engine)

    async def run() -> list[str]:
        texts: list[str] = []
        try:
            async for event in backend.generate(_request(renderer)):
                if isinstance(event, TextDelta):
                    texts.append(event.text)
                gate.release()  # the engine's next chunk, only now
        finally:
            await backend.aclose()
        return texts

    texts = asyncio.run(asyncio.wait_for(run(), 20))
    assert texts == [renderer.decode([t]) for t in renderer.encoding.encode("one two three four")]
