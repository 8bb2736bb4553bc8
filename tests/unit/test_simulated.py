"""The simulated engine's policy, scenario mode and timing accounting."""

from __future__ import annotations

import json
from typing import Any

from responses_cache.backends import (
    Finish,
    GenerationRequest,
    Scenario,
    SimulatedConfig,
    SimulatedEngine,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from responses_cache.conversation import EMPTY
from responses_cache.protocol.items import FunctionCall, FunctionCallOutput, Item, Message
from responses_cache.protocol.tools import parse_tools

SHELL = parse_tools(b'[{"type":"function","name":"exec_command","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}]')
SHELL_LIST = parse_tools(b'[{"type":"function","name":"shell","parameters":{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}}}}]')


async def _run(items: list[Item], tools=SHELL, config: SimulatedConfig | None = None) -> list[object]:  # type: ignore[no-untyped-def]
    engine = SimulatedEngine(config or SimulatedConfig(instant=True))
    request = GenerationRequest("resp_1", "sim-1", None, tools, EMPTY.extend(items), None, "a")
    return [e async for e in engine.generate(request)]


async def test_calls_the_shell_tool_with_a_backticked_command() -> None:
    events = await _run([Message(role="user", content="please run `ls -la /tmp` now")])
    assert isinstance(events[0], ToolCallStart) and events[0].name == "exec_command"
    args = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
    assert json.loads(args) == {"cmd": "ls -la /tmp"}
    assert isinstance(events[-1], Finish) and events[-1].reason == "tool_calls"


async def test_shell_tool_with_a_command_array() -> None:
    events = await _run([Message(role="user", content="run `echo hi`")], tools=SHELL_LIST)
    args = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
    assert json.loads(args) == {"command": ["bash", "-lc", "echo hi"]}


async def test_quotes_the_last_line_of_tool_output() -> None:
    events = await _run([
        Message(role="user", content="run `x`"),
        FunctionCall(call_id="c", name="exec_command", arguments="{}"),
        FunctionCallOutput(call_id="c", output="first\nthe last line\n\n"),
    ])
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert "the last line" in text


async def test_plain_text_without_a_tool() -> None:
    events = await _run([Message(role="user", content="hello `ls`")], tools=parse_tools(b"[]"))
    assert all(not isinstance(e, ToolCallStart) for e in events)
    assert "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_scenario_makes_n_calls_then_answers() -> None:
    config = SimulatedConfig(instant=True, scenario=Scenario(tool_calls=2, argument_tokens=10, answer_tokens=10))
    items: list[Item] = [Message(role="user", content="go")]
    for n in range(2):
        events = await _run(items, config=config)
        assert isinstance(events[0], ToolCallStart)
        items += [FunctionCall(call_id=f"c{n}", name="exec_command", arguments="{}"), FunctionCallOutput(call_id=f"c{n}", output="ok")]
    events = await _run(items, config=config)
    assert not any(isinstance(e, ToolCallStart) for e in events)


def test_prefix_cache_reuses_whole_leading_blocks_by_content() -> None:
    from responses_cache.backends.simulated import PrefixCache

    cache = PrefixCache(capacity_tokens=10_000, block_tokens=4)
    assert cache.lookup_and_insert(list(range(10))) == 0  # blocks [0-3], [4-7] stored; 8, 9 partial
    assert cache.lookup_and_insert(list(range(12))) == 8  # a resend that extends the prompt
    assert cache.lookup_and_insert([*range(4), 99, 5, 6, 7]) == 4  # diverges in the second block
    assert cache.lookup_and_insert([1, 2, 3]) == 0  # shorter than a block


def test_prefix_cache_forgets_least_recently_used_blocks() -> None:
    from responses_cache.backends.simulated import PrefixCache

    cache = PrefixCache(capacity_tokens=8, block_tokens=4)  # two blocks
    cache.lookup_and_insert([1, 1, 1, 1, 2, 2, 2, 2])
    cache.lookup_and_insert([3, 3, 3, 3, 4, 4, 4, 4])  # evicts the first prompt's blocks
    assert cache.lookup_and_insert([1, 1, 1, 1]) == 0


def test_prefix_cache_resume_hashes_only_new_blocks_with_the_same_result() -> None:
    from responses_cache.backends.simulated import PrefixCache

    first, second = list(range(1000)), [*range(1000), *range(5000, 5300)]
    resumed, fresh = PrefixCache(100_000, 16), PrefixCache(100_000, 16)
    assert resumed.lookup_and_insert(first) == fresh.lookup_and_insert(first) == 0
    boundary = resumed.last_boundary
    assert boundary[0] == 992  # 62 whole blocks
    assert resumed.lookup_and_insert(second, resume=boundary) == fresh.lookup_and_insert(second) == 992
    assert resumed.last_boundary == fresh.last_boundary


async def test_engine_counts_cached_prefix_of_a_continuation() -> None:
    from responses_cache.backends import Prompt
    from responses_cache.tokens import get_renderer

    renderer = get_renderer("harmony")
    engine = SimulatedEngine(SimulatedConfig(prefill_tokens_per_s=1e12, output_tokens_per_s=1e12, kv_block_tokens=16))
    log = renderer.render_full(None, SHELL, [Message(role="user", content="word " * 500)])
    longer = renderer.extend(log, [Message(role="assistant", content="ok"), Message(role="user", content="more " * 100)])
    for current in (log, longer):
        request = GenerationRequest("r", "sim-1", None, SHELL, EMPTY, Prompt(current, renderer), "conv-1")
        _ = [e async for e in engine.generate(request)]
    prompt_len = len(renderer.prompt(longer))
    assert engine.prefilled_tokens == len(renderer.prompt(log)) + prompt_len - (log.num_tokens // 16 * 16)


async def _deltas(config: SimulatedConfig, lag: int, tokens: list[str] | None = None) -> list[str]:
    """The engine's text deltas, read by a server that comes back for more when ``lag`` tokens
    past the ones it has taken are due (the engine's clock is the test's: ``tokens`` are the
    answer's tokens, one per delta of an instant engine, to count what was taken)."""
    now = [0.0]
    engine = SimulatedEngine(config, clock=lambda: now[0])
    request = GenerationRequest("resp_1", "sim-1", None, parse_tools(b"[]"), EMPTY.extend([Message(role="user", content="hi")]), None, "a")
    deltas: list[str] = []
    async for event in engine.generate(request):
        if isinstance(event, TextDelta):
            deltas.append(event.text)
            if tokens is not None:
                taken, text = 0, "".join(deltas)
                while len("".join(tokens[:taken])) < len(text):
                    taken += 1
                now[0] = (taken + 1 + lag) / config.output_tokens_per_s
    return deltas


async def test_tokens_already_due_when_the_server_comes_back_are_one_delta() -> None:
    """As the adapters' read of a real engine merges what arrived together: a server that keeps
    up gets a delta per token, one that comes back late gets the tokens due meanwhile in one, and
    an instant engine (no clock) one per token."""
    rate = 8192.0  # a token every 122 µs: the engine never sleeps, and 1/rate is exact
    config = SimulatedConfig(prefill_tokens_per_s=1e12, output_tokens_per_s=rate, answer_tokens=40)
    tokens = await _deltas(SimulatedConfig(instant=True, answer_tokens=40), 0)
    assert len(tokens) > 20
    assert await _deltas(config, 0, tokens) == tokens
    late = await _deltas(config, 2, tokens)
    assert late == ["".join(tokens[0:1])] + ["".join(tokens[i : i + 3]) for i in range(1, len(tokens), 3)]


async def test_a_burst_is_handed_over_in_batches_of_the_adapters_limit() -> None:
    from responses_cache.backends.engines import BATCH_LIMIT

    tokens = await _deltas(SimulatedConfig(instant=True, answer_tokens=2 * BATCH_LIMIT), 0)
    assert BATCH_LIMIT + 1 < len(tokens) < 2 * BATCH_LIMIT + 1
    config = SimulatedConfig(prefill_tokens_per_s=1e12, output_tokens_per_s=8192.0, answer_tokens=2 * BATCH_LIMIT)
    burst = await _deltas(config, 10**9, tokens)
    assert burst == ["".join(tokens[:1]), "".join(tokens[1 : 1 + BATCH_LIMIT]), "".join(tokens[1 + BATCH_LIMIT :])]


async def test_an_sse_stream_has_response_created_out_before_the_engine_works() -> None:
    """A real engine works in a process of its own, while the server writes: the simulated engine
    yields to the server before its own work, so an SSE stream's ``response.created`` is written
    before the engine's prefill (not after its first stretch of work)."""
    from responses_cache import create_app
    from tests.asgi_turns import asgi_client

    sent: list[bytes] = []
    written_first: list[bool] = []

    class Watched(SimulatedEngine):
        def _prefill_accounting(self, request: GenerationRequest) -> tuple[int, int]:
            written_first.append(any(b"response.created" in body for body in sent))
            return super()._prefill_accounting(request)

    app = create_app(backend=Watched(SimulatedConfig(prefill_tokens_per_s=1e12, output_tokens_per_s=1e12)), renderer="harmony")

    async def recorder(scope: Any, receive: Any, send: Any) -> None:
        async def record(message: Any) -> None:
            if message["type"] == "http.response.body":
                sent.append(message.get("body", b""))
            await send(message)

        await app(scope, receive, record)

    async with asgi_client(recorder) as client:
        reply = await client.post("/responses", json={"model": "sim-1", "input": "hi", "stream": True})
    assert reply.status_code == 200 and b"response.completed" in reply.content
    assert written_first == [True]
