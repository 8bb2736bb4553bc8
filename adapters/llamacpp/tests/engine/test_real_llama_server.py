"""The llama.cpp adapter against a real ``llama-server`` (built from source, CPU, tiny random-weight
GGUF models). The models' answers are noise; what is real is the server: its template and
tokenizer, its ``/completion`` stream of token ids, its slots and their prompt caches, its
context limit and its cancellation of a request whose client left. Every frame the SDK receives
is validated strictly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llama_suite import CONTEXT, KEY, Family, Recorder, as_input, sdk, turn, wait
from responses_cache_llamacpp import HandshakeError, LlamaCppBackend

from benchmarks.suite.llamaproc import Build, LlamaServer
from responses_cache import Route, StaticRouter, create_app, get_renderer
from responses_cache.protocol.request import decode_input
from responses_cache.protocol.tools import EMPTY_TOOLS, parse_tools
from responses_cache.testing import start_once
from responses_cache.tokens import common_prefix_length
from tests.tokens._strategies import examples, instructions, items_
from tests.websocket.wsclient import check_event, recv_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]  # the first one builds llama-server (minutes)

WEATHER = [{
    "type": "function", "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "day": {"type": "integer"}},
                   "required": ["city"]},
}]


def _server(family: Family, factory: Callable[..., Any], recorder: Recorder | None = None, source: str = "gguf",
            **options: Any) -> Any:
    """``responses-cache`` in front of the family's server, with the family's renderer (the
    object the suite built once: loading it costs seconds; the handshake runs on first use)."""
    backend = family.backend(transport=recorder, **options)
    route = Route(name="default", model=family.name, backend=backend, renderer=family.renderer_of(source))
    return factory(create_app(backend=backend, router=StaticRouter({family.name: route}, default=route), api_keys=[KEY]))


@pytest.mark.parametrize("source", ["gguf", "hf"])
def test_an_sdk_tool_loop_sends_the_servers_own_rendering_and_hits_its_prefix_cache(
    family: Family, source: str, responses_cache_server_factory: Callable[..., Any]
) -> None:
    # The renderer made from the GGUF (gguf:<file>), and the one of the files it was made from
    # (hf:<dir>): both send exactly what llama-server renders and tokenizes for the messages.
    recorder = Recorder()
    renderer = family.renderer_of(source)
    server = _server(family, responses_cache_server_factory, recorder, source)
    instructions = "You are a weather assistant. Answer in one line."
    tools = parse_tools(json.dumps(WEATHER).encode())
    # What the client sends each turn: a tool loop (calls, outputs, reasoning), then a new question.
    # tool_choice "none" keeps the noise from starting a call the next turn would have to answer.
    turns: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": "What is the weather in Paris today? Ünïcödé 日本語 2026-12-01"}],
        [{"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
         {"type": "function_call_output", "call_id": "c1", "output": "18 C, sunny"}],
        [{"type": "reasoning", "id": "rs_1", "summary": [],
          "content": [{"type": "reasoning_text", "text": "Two cities: call the tool for each."}]},
         {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Lyon", "day": 1}'},
         {"type": "function_call", "call_id": "c3", "name": "get_weather", "arguments": '{"city": "Nice", "day": 1}'},
         {"type": "function_call_output", "call_id": "c2", "output": "20 C"},
         {"type": "function_call_output", "call_id": "c3", "output": "22 C, windy"}],
        [{"role": "user", "content": "Thanks! And in 100 days?"}],
    ]
    conversation: list[dict[str, Any]] = []
    responses: list[dict[str, Any]] = []
    cached_by_server: list[float] = []
    with sdk(server.http_url) as client, client.responses.connect() as conn:
        for n, given in enumerate(turns):
            before = family.metrics()
            response = turn(conn, model=family.name, instructions=instructions, tools=WEATHER, tool_choice="none",
                            input=given, previous_response_id=responses[-1]["id"] if responses else None,
                            temperature=0, max_output_tokens=8)
            assert response["status"] in ("completed", "incomplete"), response
            after = family.metrics()
            cached_by_server.append(after["llamacpp:prompt_tokens_cached_total"]
                                    - before["llamacpp:prompt_tokens_cached_total"])
            conversation += given
            items = decode_input(json.dumps(conversation).encode())
            # The prompt sent is the server's own rendering of the conversation so far.
            expected = family.rendering(instructions, tools, items)
            assert recorder.prompts[n] == expected, (
                family.name, n, renderer.decode(recorder.prompts[n]), renderer.decode(expected))
            conversation += [as_input(item) for item in response["output"]]
            responses.append(response)
    bodies = recorder.bodies
    assert len(bodies) == len(turns)
    # One conversation, one slot: every turn on the slot that holds the previous prompt.
    assert len({body["id_slot"] for body in bodies}) == 1, [body["id_slot"] for body in bodies]
    assert all(body["cache_prompt"] and body["return_tokens"] for body in bodies)
    inputs = [r["usage"]["input_tokens"] for r in responses]
    cached = [r["usage"]["input_tokens_details"]["cached_tokens"] for r in responses]
    assert inputs == [len(p) for p in recorder.prompts]
    engine_cached = [recorder.timings(n)["cache_n"] for n in range(len(turns))]
    # The server's two counters agree: each request's timings and its /metrics.
    assert cached_by_server == engine_cached, (cached_by_server, engine_cached)
    for n in range(1, len(responses)):
        # From turn 2 the slot's prompt cache served the whole previous prompt, or up to what the
        # template rewrote (Qwen's drops the reasoning before a new user message; a tool step
        # rewrites nothing), and more of the answer where its rendering equals the sampled ids.
        kept = common_prefix_length(recorder.prompts[n - 1], recorder.prompts[n])
        assert engine_cached[n] >= kept > 0, (n, inputs, engine_cached, kept)
        if n < 3:
            assert kept == inputs[n - 1], (n, inputs, kept)
        # The token log served at least as much (it reuses the rendered answer, not its noise).
        assert cached[n - 1] < cached[n] < inputs[n] and cached[n] >= kept, (n, inputs, cached, kept)


def test_two_conversations_on_two_slots_do_not_evict_each_other(
    qwen: Family, responses_cache_server_factory: Callable[..., Any]
) -> None:
    recorder = Recorder()
    server = _server(qwen, responses_cache_server_factory, recorder)
    opening = "Here is the plan for today, step by step: " + " ".join(f"step {n}." for n in range(30))
    with sdk(server.http_url) as client, client.responses.connect() as a, client.responses.connect() as b:
        first_a = turn(a, model=qwen.name, input=opening, temperature=0, max_output_tokens=4)
        first_b = turn(b, model=qwen.name, input="Another plan: " + opening, temperature=0, max_output_tokens=4)
        second_a = turn(a, model=qwen.name, input="And then?", previous_response_id=first_a["id"],
                        temperature=0, max_output_tokens=4)
        second_b = turn(b, model=qwen.name, input="And then?", previous_response_id=first_b["id"],
                        temperature=0, max_output_tokens=4)
    slots = [body["id_slot"] for body in recorder.bodies]
    assert slots[0] != slots[1] and slots[2] == slots[0] and slots[3] == slots[1], slots
    for first, second in ((first_a, second_a), (first_b, second_b)):
        # Each continuation found its whole previous prompt in its slot's cache.
        assert second["usage"]["input_tokens_details"]["cached_tokens"] >= first["usage"]["input_tokens"]


def test_with_history_keep_the_server_evaluates_only_the_new_turn_as_for_token_ids_sent_straight(
    qwen: Family, responses_cache_server_factory: Callable[..., Any]
) -> None:
    """``history="keep"``: each prompt is the previous one, the ids the model sampled after it, and
    the new turn's -- what a client sending token ids straight to ``/completion`` sends (the
    benchmark's floor) -- so from turn 2 the server evaluates only the new turn and the previous
    answer's last id (its slot holds the previous prompt and the answer, all but the last id
    evaluated): its own ``timings``. So even where the random model's answers do not re-tokenize
    to the ids it sampled, and though Qwen3's template writes an empty thinking block in the last
    answer and drops it once a message follows (until 2026-12-04 that drop counted as a rewrite of
    the answer, whose text was tokenized again: the server evaluated the answer again each turn)."""
    recorder = Recorder()
    renderer = get_renderer(qwen.template("gguf"), history="keep")
    backend = qwen.backend(transport=recorder, extra_body={"ignore_eos": True})
    route = Route(name="default", model=qwen.name, backend=backend, renderer=renderer)
    server = responses_cache_server_factory(
        create_app(backend=backend, router=StaticRouter({qwen.name: route}, default=route), api_keys=[KEY]))
    turns = 4
    logged = len(qwen.server.evaluated())
    with sdk(server.http_url) as client, client.responses.connect() as conn:
        previous = None
        for n in range(turns):
            response = turn(conn, model=qwen.name, input=f"Question {n}: and what comes next?",
                            previous_response_id=previous, temperature=0, max_output_tokens=16)
            assert response["status"] == "incomplete", response
            previous = response["id"]
    prompts = recorder.prompts
    sampled = [recorder.sampled(n) for n in range(turns)]
    # The case at stake: answers whose text tokenizes to other ids than the model sampled.
    assert any(renderer.encode_text(renderer.decode(ids)) != ids for ids in sampled[:-1]), sampled
    for n in range(1, turns):
        before = prompts[n - 1] + sampled[n - 1]
        assert prompts[n][: len(before)] == before, (n, common_prefix_length(prompts[n], before), len(before))
        timings = recorder.timings(n)
        assert timings["cache_n"] == len(before) - 1, (n, timings, len(before))
        assert timings["prompt_n"] == len(prompts[n]) - len(before) + 1, (n, timings, len(prompts[n]), len(before))
    # The server's log says the same (what the benchmark reads for every path). It writes a task's
    # line as the task ends, which may be after its last chunk reached us: wait for all four.
    deadline = time.monotonic() + 10
    while len(evaluated := qwen.server.evaluated()) < logged + turns and time.monotonic() < deadline:
        time.sleep(0.05)
    assert evaluated[logged + 1 : logged + turns] == [recorder.timings(n)["prompt_n"] for n in range(1, turns)]


def test_a_prompt_over_the_context_is_refused_before_the_response_exists(
    qwen: Family, responses_cache_server_factory: Callable[..., Any]
) -> None:
    # The slot's context (read from /props) is the limit: an error, no response.created. Then
    # with a context configured larger than the server's, the server's own refusal (its
    # exceed_context_size_error, answered before its HTTP status) is the same error.
    for options in ({}, {"context_window": 100_000}):
        server = _server(qwen, responses_cache_server_factory, **options)
        with sdk(server.http_url) as client, client.responses.connect() as conn:
            conn.response.create(model=qwen.name, store=False, input="lorem " * (CONTEXT + 1000), max_output_tokens=16)
            event = json.loads(conn.recv_bytes())
            check_event(event)
            assert event["type"] == "error" and event["status"] == 400, (options, event)
            assert event["error"]["code"] == "context_length_exceeded", (options, event)
            assert str(CONTEXT) in event["error"]["message"], event
            # The socket stays usable.
            assert turn(conn, model=qwen.name, input="short", max_output_tokens=4)["status"] in ("completed", "incomplete")


def test_a_client_leaving_mid_answer_frees_the_slot(
    qwen: Family, responses_cache_server_factory: Callable[..., Any]
) -> None:
    from websockets.sync.client import connect

    # The stop tokens are banned: the answer would run to 3,000 tokens.
    stops = qwen.renderer.sampling_stop_tokens
    recorder = Recorder()
    server = _server(qwen, responses_cache_server_factory, recorder,
                     extra_body={"logit_bias": [[t, False] for t in stops]})
    cancelled = qwen.server.cancelled()
    with connect(server.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}, close_timeout=1) as ws:
        ws.send(json.dumps({"type": "response.create", "model": qwen.name, "input": "Go on forever.",
                            "temperature": 0, "max_output_tokens": 3000}))
        while (event := json.loads(ws.recv(timeout=60)))["type"] != "response.output_text.delta":
            check_event(event)
        slot = recorder.bodies[-1]["id_slot"]
        released = len(qwen.server.released(slot))
    # Closing the engine stream cancelled the server's task: the slot was released with its answer
    # cut short (the prompt and far fewer than 3,000 tokens), and is idle.
    wait(lambda: qwen.server.cancelled() > cancelled and len(qwen.server.released(slot)) > released,
         "the server to cancel the task and release the slot", qwen.server)
    held = qwen.server.released(slot)[-1]
    assert held < len(recorder.prompts[-1]) + 3000, held
    assert not qwen.server.slot_states()[slot]["is_processing"]


def test_a_steer_stops_the_servers_task_and_the_successor_continues_from_its_cache(
    qwen: Family, responses_cache_server_factory: Callable[..., Any]
) -> None:
    """``response.steer`` against the real server: the target's task is cancelled mid-answer (its
    slot released long before its limit), and the successor's prompt is the target's whole
    prompt and the ids it sampled, then the steering message: the slot's cache holds all but the
    new message, so the server evaluates only that."""
    from websockets.sync.client import connect

    # No stop token and no added token (the noise would open a tool call or a think block; Qwen3's
    # come after its ordinary vocabulary, from <|endoftext|> on): the target would run to its
    # limit, about a minute on one CPU thread.
    added = range(min(qwen.renderer.sampling_stop_tokens), qwen.renderer.encoding.n_vocab)
    recorder = Recorder()
    server = _server(qwen, responses_cache_server_factory, recorder,
                     extra_body={"logit_bias": [[t, False] for t in added]})
    cancelled = qwen.server.cancelled()
    limit = CONTEXT // 2
    with connect(server.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}, close_timeout=1) as ws:
        ws.send(json.dumps({"type": "response.create", "model": qwen.name, "input": "Tell me a long story.",
                            "temperature": 0, "max_output_tokens": limit}))
        target = recv_until(ws, "response.created")["response"]["id"]
        recv_until(ws, "response.output_text.delta")
        ws.send(json.dumps({"type": "response.steer", "previous_response_id": target, "input": "Stop. Be brief."}))
        recv_until(ws, "response.steer.accepted")
        steered = recv_until(ws, "response.incomplete")["response"]
        assert steered["id"] == target and steered["incomplete_details"] == {"reason": "steered"}, steered
        successor = recv_until(ws, "response.created")["response"]
        assert successor["previous_response_id"] == target, successor
        recv_until(ws, "response.output_text.delta")  # the successor's prompt is evaluated
        slot = recorder.bodies[1]["id_slot"]
        state = qwen.server.slot_states()[slot]  # its figures while the successor runs
    # The target's task was cancelled with far fewer tokens than its limit; the successor's too,
    # once the client left.
    wait(lambda: qwen.server.cancelled() >= cancelled + 2, "the server to cancel both tasks", qwen.server)
    first, second = recorder.prompts
    assert len(recorder.bodies) == 2 and recorder.bodies[0]["id_slot"] == slot
    assert steered["usage"]["output_tokens"] < limit // 2, steered["usage"]
    # The successor continues the target's own token log: its prompt and what it sampled, as ids.
    kept = first + recorder.sampled(0)[: steered["usage"]["output_tokens"]]
    assert second[: len(kept)] == kept, (qwen.renderer.decode(second), qwen.renderer.decode(kept))
    tail = qwen.renderer.decode(second[len(kept):])
    assert "Stop. Be brief." in tail and "Tell me a long story." not in tail, tail
    # The slot's cache held all of it: the server evaluated the steering message only.
    assert state["is_processing"], state
    assert state["n_prompt_tokens_cache"] >= len(kept) - 1, (state, len(kept))
    assert state["n_prompt_tokens_processed"] <= len(second) - len(kept) + 1, (state, len(second), len(kept))


def test_a_named_tool_choice_is_answered_with_that_call_and_its_output_continues_the_conversation(
    qwen: Family, responses_cache_server_factory: Callable[..., Any]
) -> None:
    """``tool_choice`` naming a function against the real server: the prompt is the server's own
    rendering with the call opened in the template's format, the server continues it, and the
    client gets that function's call; the next turn, with the call's output, is again the
    server's own rendering of the whole conversation."""
    # The random model's noise is no JSON: llama-server's own JSON-schema constraint makes it
    # write arguments (a device of this test; a real model writes them itself).
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    recorder = Recorder()
    server = _server(qwen, responses_cache_server_factory, recorder, extra_body={"json_schema": schema})
    tools = parse_tools(json.dumps(WEATHER).encode())
    conversation: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    with sdk(server.http_url) as client, client.responses.connect() as conn:
        called = turn(conn, model=qwen.name, input=conversation, tools=WEATHER, temperature=0, max_output_tokens=64,
                      tool_choice={"type": "function", "name": "get_weather"})
        assert called["status"] == "completed", called
        [call] = called["output"]
        assert call["type"] == "function_call" and call["name"] == "get_weather", call
        assert set(json.loads(call["arguments"])) == {"city"}, call
        opened = qwen.rendering(None, tools, decode_input(json.dumps(conversation).encode()))
        assert recorder.prompts[0][: len(opened)] == opened
        assert qwen.renderer.decode(recorder.prompts[0][len(opened):]) == '<tool_call>\n{"name": "get_weather", "arguments": '
        conversation += [as_input(call), {"type": "function_call_output", "call_id": call["call_id"], "output": "18 C"}]
        answered = turn(conn, model=qwen.name, input=conversation[2:], tools=WEATHER, temperature=0,
                        max_output_tokens=4, previous_response_id=called["id"], tool_choice="none")
        assert answered["status"] in ("completed", "incomplete"), answered
    expected = qwen.rendering(None, tools, decode_input(json.dumps(conversation).encode()))
    assert recorder.prompts[1] == expected, (qwen.renderer.decode(recorder.prompts[1]), qwen.renderer.decode(expected))


def test_the_tokenizer_handshake_passes_and_another_familys_refuses(llama_servers: dict[str, Family]) -> None:
    for family in llama_servers.values():
        start_once(family.backend(template=family.renderer))
        other = next((f for f in llama_servers.values() if f is not family), None)
        if other is not None:
            with pytest.raises(HandshakeError, match="tokenizes differently"):
                start_once(family.backend(template=other.renderer))


#: Tool sets as agents send them (functions with descriptions and schemas, a namespace, a custom
#: tool). Random tool schemas are left to the hf renderer's own tests: llama.cpp re-serializes a
#: tool's schema before its template sees it (``0.0`` becomes ``0``, a ``null`` description is
#: refused, ``"enum": []`` too), which the template here does not do.
AGENT_TOOLS = [EMPTY_TOOLS, parse_tools(json.dumps(WEATHER).encode()), parse_tools(json.dumps([
    {"type": "function", "name": "exec_command", "description": "Run a shell command.",
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "timeout_ms": {"type": "integer"}},
                    "required": ["cmd"], "additionalProperties": False}},
    {"type": "namespace", "name": "mcp__files", "description": "Files.", "tools": [
        {"type": "function", "name": "read", "description": "Read a file.",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]},
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch."},
]).encode())]


@settings(deadline=None, max_examples=examples(15), database=None)
@given(data=st.data())
def test_random_conversations_render_as_the_server_does(family: Family, data: st.DataObject) -> None:
    """The ``gguf:`` renderer's ids for random conversations, rendered in two steps, equal the
    server's ``/apply-template`` then ``/tokenize`` of the same messages and tools."""
    r = family.renderer
    tools = data.draw(st.sampled_from(AGENT_TOOLS))
    instr = data.draw(instructions)
    items = data.draw(items_(min_size=1, max_size=8))
    if not r.chat_messages(instr, items):
        return
    cut = data.draw(st.integers(0, len(items)))
    if not r.chat_messages(instr, items[:cut]):
        cut = 0  # no message yet: a real template refuses to render nothing
    log = r.extend(r.extend(r.begin(instr, tools), items[:cut]), items[cut:])
    assert list(r.prompt(log)) == family.rendering(instr, tools, items)



def test_a_server_killed_mid_stream_fails_the_response_and_the_next_turn_works_once_it_is_back(
    qwen: Family, responses_cache_server_factory: Callable[..., Any]
) -> None:
    stops = qwen.renderer.sampling_stop_tokens
    server = _server(qwen, responses_cache_server_factory, extra_body={"logit_bias": [[t, False] for t in stops]})
    with sdk(server.http_url) as client, client.responses.connect() as conn:
        # Stored: a failed turn evicts its predecessor from the connection's cache (WebSocket
        # mode), and the next turn (stored too) continues it from the store.
        first = turn(conn, model=qwen.name, input="Hello there.", temperature=0, max_output_tokens=4, store=True)
        conn.response.create(model=qwen.name, store=True, input="Go on forever.", previous_response_id=first["id"],
                             temperature=0, max_output_tokens=3000)
        while (event := json.loads(conn.recv_bytes()))["type"] != "response.output_text.delta":
            check_event(event)
        qwen.server.kill()
        while (event := json.loads(conn.recv_bytes()))["type"] not in ("response.failed", "response.completed"):
            check_event(event)
        check_event(event)
        assert event["type"] == "response.failed", event
        assert event["response"]["error"]["code"] == "server_error", event
        qwen.server.start()  # the same port: back in service, its slots empty
        again = turn(conn, model=qwen.name, input="Are you still there?", previous_response_id=first["id"],
                     temperature=0, max_output_tokens=4, store=True)
        assert again["status"] in ("completed", "incomplete"), again
        assert again["usage"]["input_tokens"] > first["usage"]["input_tokens"]



def test_a_conversation_whose_server_is_gone_goes_on_on_the_next_one(
    qwen: Family, llama_build: Build, responses_cache_server_factory: Callable[..., Any]
) -> None:
    """Fail-over between two real servers: the conversation's server killed between turns, the
    next turn goes to the other one with the whole conversation (the server's own rendering of
    it, evaluated there from nothing), and the turn after finds it in that server's cache."""
    spares = [LlamaServer(llama_build, qwen.gguf, alias=qwen.name, slots=2, context=CONTEXT,
                          extra_args=["--no-prefill-assistant"]) for _ in range(2)]
    try:
        for spare in spares:
            spare.launch()
        for spare in spares:
            spare.wait_ready()
        recorder = Recorder()
        backend = LlamaCppBackend([spare.url for spare in spares], model=qwen.name, transport=recorder)
        route = Route(name="default", model=qwen.name, backend=backend, renderer=qwen.renderer)
        server = responses_cache_server_factory(
            create_app(backend=backend, router=StaticRouter({qwen.name: route}, default=route), api_keys=[KEY]))
        conversation: list[dict[str, Any]] = []
        responses: list[dict[str, Any]] = []
        with sdk(server.http_url) as client, client.responses.connect() as conn:
            for n, text in enumerate(["Hello there.", "Are you still there?", "And now?"]):
                if n == 1:
                    next(spare for spare in spares if spare.url == recorder.servers[0]).kill()
                response = turn(conn, model=qwen.name, input=text, temperature=0, max_output_tokens=4,
                                previous_response_id=responses[-1]["id"] if responses else None)
                assert response["status"] in ("completed", "incomplete"), response
                conversation += [{"role": "user", "content": text}]
                if n == 1:
                    # The other server got the whole conversation, as it renders it itself.
                    expected = qwen.rendering(None, EMPTY_TOOLS, decode_input(json.dumps(conversation).encode()))
                    assert recorder.prompts[1] == expected, (qwen.renderer.decode(recorder.prompts[1]),
                                                             qwen.renderer.decode(expected))
                conversation += [as_input(item) for item in response["output"]]
                responses.append(response)
    finally:
        for spare in spares:
            spare.close()
    assert recorder.servers[1] == recorder.servers[2] != recorder.servers[0], recorder.servers
    assert recorder.timings(1)["cache_n"] == 0  # nothing of it on that server before
    kept = common_prefix_length(recorder.prompts[1], recorder.prompts[2])
    assert recorder.timings(2)["cache_n"] >= kept > len(recorder.prompts[1]) // 2, (kept, recorder.prompts)
    assert responses[2]["usage"]["input_tokens_details"]["cached_tokens"] >= kept
