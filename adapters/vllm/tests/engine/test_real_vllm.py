"""The vLLM adapter against a real vLLM (CPU build, tiny random-weight model): in both modes
(``responses-cache`` in front of the engine, and the middleware inside it) and on both endpoints
(the tokens-in route with ``--enable-scale-out``, ``/v1/completions`` on a stock server).

The model's answers are noise; what is real is the engine: its HTTP API, token ids, streaming,
usage, prefix cache, context limit and aborts. Every frame the SDK receives is validated strictly.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from engine_suite import ENDLESS, KEY, MODEL, Target, network_backend, next_event, sdk, turn
from responses_cache_vllm import HandshakeError
from websockets.sync.client import connect

from benchmarks.suite.vllmproc import VllmProcess
from responses_cache import create_app
from responses_cache.conversation.sealing import Sealer, new_key
from responses_cache.testing import start_once, wait_for
from tests.websocket.wsclient import check_event, recv_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]  # the first one installs vLLM

#: The opening message: several of the engine's 32-token cache blocks long.
OPENING = "Here is the plan for today, step by step: " + " ".join(f"step {n} is to check item {n}." for n in range(40))


def conversation(target: Target, turns: int, hits: list[float] | None = None, **body: Any) -> list[dict[str, Any]]:
    """A WebSocket conversation (new input and ``previous_response_id`` each turn); ``hits``
    collects the engine's prefix-cache hits per turn when given (one conversation at a time)."""
    with sdk(target.http_url) as client, client.responses.connect() as conn:
        responses: list[dict[str, Any]] = []
        for n in range(turns):
            previous = responses[-1]["id"] if responses else None
            before = target.engine.counters()
            responses.append(turn(conn, input=OPENING if n == 0 else f"Turn {n}: and then?",
                                  previous_response_id=previous, **body))
            if hits is not None:
                hits.append((target.engine.counters() - before).prefix_hits)
    return responses


def assert_continued(responses: list[dict[str, Any]], hits: list[float] | None = None) -> None:
    """Each continuation's prompt extends the previous one: the token log reused all of it (the
    client's ``cached_tokens``), and so did the engine's prefix cache (its own hit counter, to its
    32-token block) — a continuation that dropped context would miss both."""
    cached = [r["usage"]["input_tokens_details"]["cached_tokens"] for r in responses]
    inputs = [r["usage"]["input_tokens"] for r in responses]
    for n in range(1, len(responses)):
        assert inputs[n - 1] < cached[n] < inputs[n], (inputs, cached)
        if hits is not None:
            assert hits[n] >= (inputs[n - 1] // 32 - 1) * 32, (inputs, hits)


def test_max_output_tokens_ends_a_response_incomplete(target: Target) -> None:
    (response,) = conversation(target, 1, temperature=0, max_output_tokens=20)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["output_tokens"] == 20


def test_a_prompt_over_the_context_window_is_context_length_exceeded(target: Target) -> None:
    # The engine's max_model_len (4096) is the limit: a 400 before the response exists.
    long_input = "lorem " * 5000
    with sdk(target.http_url) as client, client.responses.connect() as conn:
        conn.response.create(model=MODEL, store=False, input=long_input)
        event = json.loads(conn.recv_bytes())
        check_event(event)
        assert event["type"] == "error" and event["status"] == 400, event
        assert event["error"]["code"] == "context_length_exceeded" and "4096" in event["error"]["message"]
        # The socket stays usable.
        assert turn(conn, input="short")["status"] == "completed"


def test_a_request_the_engine_refuses_is_an_error_before_the_response(target: Target) -> None:
    # vLLM takes top_p in (0, 1]; the Responses API lets a client send 0. vLLM's refusal (its 400 on
    # a route, its SamplingParams' error on the engine client) comes before the response exists.
    with sdk(target.http_url) as client, client.responses.connect() as conn:
        conn.response.create(model=MODEL, store=False, input="hi", top_p=0)
        event = json.loads(conn.recv_bytes())
        check_event(event)
        assert event["type"] == "error" and "top_p" in event["error"]["message"], event
        # The socket stays usable.
        assert turn(conn, input="short", max_output_tokens=4)["status"] == "incomplete"


def test_max_output_tokens_is_capped_by_the_context_window(target: Target) -> None:
    # No max_output_tokens: the engine may write up to what the window leaves, and no more.
    prompt = "lorem " * 3950
    with sdk(target.http_url) as client, client.responses.connect() as conn:
        response = turn(conn, input=prompt, temperature=0)
    usage = response["usage"]
    assert response["status"] == "incomplete", response.get("error")
    assert usage["input_tokens"] + usage["output_tokens"] == target.engine.max_model_len


def _wait(condition: Callable[[], bool], what: str, engine: VllmProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}; the engine's log ends:\n{engine.tail(15)}"
        time.sleep(0.1)


def test_a_client_leaving_mid_response_aborts_the_engine_request(target: Target) -> None:
    # The engine must still run the request when the client leaves. On 2 shared cores a client
    # that waits for a few deltas first could not promise that: the process that relays them (this
    # one, in network mode) went unscheduled for 13 s while vLLM generated, the greedy 3,000
    # tokens were written by then, and the first deltas reached the client after the engine had
    # finished. So the engine is paused (its scheduler stopped, requests kept) while the client
    # creates the response and leaves: the request reached the engine, was never finished, and the
    # server's close of the engine stream must abort it.
    target.engine.pause()
    try:
        with connect(target.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}, close_timeout=1) as ws:
            ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "Go on forever.", **ENDLESS}))
            while (event := json.loads(ws.recv(timeout=60)))["type"] != "response.created":
                check_event(event)
            response_id = event["response"]["id"]
            _wait(lambda: target.engine.received(response_id), "the engine's request", target.engine)
        # The engine aborted the request, paused or not, and freed its slot.
        _wait(lambda: target.engine.aborted(response_id), "the engine's abort", target.engine)
    finally:
        target.engine.resume()
    _wait(lambda: target.engine.counters().running == 0, "the engine's free slot", target.engine)


def test_steering_aborts_the_engine_request_and_the_successor_continues_it(target: Target) -> None:
    # The steer must reach the server while the engine still runs the target. A client that
    # steers at the target's first delta cannot promise that on a busy machine: on 2 shared
    # cores the test process was not scheduled for 10-13 s at a time while vLLM generated (an
    # idle probe process alike), the greedy target had written its 3,000 tokens by then, and
    # the server took the steer within milliseconds of its sending, with nothing left to abort.
    # So the engine is paused (its scheduler stopped, requests kept) while the client creates
    # the target and steers it: the target is accepted and waits, and once resumed the engine
    # prefills it and starts sampling, and the server stops it at its first event.
    with connect(target.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}, close_timeout=1) as ws:
        before = target.engine.counters()
        target.engine.pause()
        try:
            # Greedy: the target runs until it is steered.
            ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": OPENING, **ENDLESS}))
            target_id = recv_until(ws, "response.created")["response"]["id"]
            assert target.engine.received(target_id), target.engine.tail(12)
            steer = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Stop. Be brief."}]}]
            ws.send(json.dumps({"type": "response.steer", "previous_response_id": target_id, "input": steer}))
            recv_until(ws, "response.steer.accepted")
        finally:
            target.engine.resume()
        steered = recv_until(ws, "response.incomplete")["response"]
        successor = recv_until(ws, "response.created")["response"]
        recv_until(ws, "response.output_text.delta")  # the successor's prompt is prefilled
        # The engine's counters follow its steps: wait for the successor's prefill to show.
        expected = (steered["usage"]["input_tokens"] // 32 - 1) * 32
        _wait(lambda: (target.engine.counters() - before).prefix_hits >= expected, "the successor's cache hits",
              target.engine, timeout=10)
        # The engine's request for the target was aborted (it had been prefilled and was sampling:
        # the engine's first event is what the server stopped it at), the successor's runs on.
        _wait(lambda: target.engine.aborted(target_id), "the target's abort", target.engine)
        assert not target.engine.aborted(successor["id"])
        # (Leaving now ends the successor, which would run its inherited 3,000 tokens.)
    assert steered["id"] == target_id and steered["incomplete_details"] == {"reason": "steered"}
    assert successor["previous_response_id"] == target_id and successor["status"] == "in_progress"


def test_eight_concurrent_connections(target: Target) -> None:
    results: list[list[dict[str, Any]]] = []
    errors: list[BaseException] = []
    before = target.engine.counters()

    def run() -> None:
        try:
            results.append(conversation(target, 3))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    assert len(results) == 8
    for responses in results:
        assert [r["status"] for r in responses] == ["completed"] * 3
        assert_continued(responses)
    # Every continuation was served from the engine's cache (the connections share one engine).
    expected = sum((r[n - 1]["usage"]["input_tokens"] // 32 - 1) * 32 for r in results for n in (1, 2))
    assert (target.engine.counters() - before).prefix_hits >= expected


# -- network mode only ---------------------------------------------------------------------------


def test_tenants_do_not_share_the_engines_prefix_cache(
    engines: dict[str, VllmProcess], responses_cache_server_factory: Callable[..., Any]
) -> None:
    # Per-tenant cache_salt: the same prompt on a new connection is an engine cache hit for the
    # same tenant, and a miss for another.
    engine = engines["scale_out"]
    server = responses_cache_server_factory(create_app(
        backend=network_backend(engine), renderer="harmony", api_keys={"sk-a": "tenant-a", "sk-b": "tenant-b"}))

    def hits(key: str) -> float:
        before = engine.counters()
        with sdk(server.http_url, key) as client, client.responses.connect() as conn:
            prompt = turn(conn, input=OPENING + " (tenants)")["usage"]["input_tokens"]
        return (engine.counters() - before).prefix_hits / prompt

    hits("sk-a")
    assert hits("sk-a") > 0.8
    assert hits("sk-b") == 0


def test_the_tokenizer_handshake_passes_and_a_wrong_template_refuses_to_start(
    engines: dict[str, VllmProcess],
) -> None:
    start_once(network_backend(engines["scale_out"]))  # harmony on o200k_harmony: the same ids
    with pytest.raises(HandshakeError, match="tokenizes differently"):
        start_once(network_backend(engines["scale_out"], template="chatml"))


@pytest.mark.parametrize("which", ["scale_out", "stock"], ids=["generate", "completions"])
def test_the_engines_own_context_error_is_context_length_exceeded(
    which: str, engines: dict[str, VllmProcess], responses_cache_server_factory: Callable[..., Any]
) -> None:
    # A context window configured larger than the engine's: the engine itself refuses the prompt.
    # On /v1/completions that is its HTTP 400: an error before the response exists. The tokens
    # route answers 200 and then an error chunk (vLLM 0.32): the response has been created, and
    # fails with the code clients act on (which the SDK's ResponseErrorCode does not list, so that
    # one event is not validated strictly).
    backend = network_backend(engines[which], context_window=100_000)
    server = responses_cache_server_factory(create_app(backend=backend, renderer="harmony", api_keys=[KEY]))
    with sdk(server.http_url) as client, client.responses.connect() as conn:
        conn.response.create(model=MODEL, store=False, input="lorem " * 5000, max_output_tokens=16)
        first = next_event(conn, "response.created", "error")
        if which == "stock":
            assert first["type"] == "error" and first["status"] == 400, first
            assert first["error"]["code"] == "context_length_exceeded", first
        else:
            assert first["type"] == "response.created", first
            while (event := json.loads(conn.recv_bytes()))["type"] != "response.failed":
                check_event(event)
            assert event["response"]["error"]["code"] == "context_length_exceeded", event
        assert turn(conn, input="short", max_output_tokens=16)["status"] in ("completed", "incomplete")  # not failed


def test_a_compaction_on_the_real_engine(
    engines: dict[str, VllmProcess], responses_cache_server_factory: Callable[..., Any]
) -> None:
    # client.responses.compact: the engine writes the summary (a generation on the conversation's
    # token log plus the summary prompt, so its prefix cache serves the conversation), and the
    # compacted output continues the conversation.
    engine = engines["scale_out"]
    server = responses_cache_server_factory(create_app(
        backend=network_backend(engine), renderer="harmony", api_keys=[KEY], sealer=Sealer.from_text(new_key())))
    with sdk(server.http_url) as client:
        first = client.responses.create(model=MODEL, input=OPENING)
        second = client.responses.create(model=MODEL, input="And after that?", previous_response_id=first.id)
        before = engine.counters()
        compacted = client.responses.compact(model=MODEL, previous_response_id=second.id)
        hits = (engine.counters() - before).prefix_hits
        assert compacted.output[-1].type == "compaction" and compacted.usage is not None
        assert second.usage is not None and hits >= (second.usage.input_tokens // 32 - 1) * 32, hits
        # The SDK types the compacted window's items as output items, so its kept user messages
        # (``input_text`` parts) make pydantic warn when dumped; the items are passed on unmodified.
        window = [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]
        follow = client.responses.create(model=MODEL, input=[*window, {"role": "user", "content": "Go on."}])
        again = client.responses.create(model=MODEL, input="Then?", previous_response_id=follow.id)
    assert follow.status == "completed" and again.status == "completed"
    assert again.usage is not None and again.usage.input_tokens_details.cached_tokens > 0


# -- in-process mode: vLLM's engine client -------------------------------------------------------


def test_the_middleware_generates_through_vllms_engine_client(engines: dict[str, VllmProcess]) -> None:
    # Each turn goes to vLLM's engine client (its log: ``Added request <id>-<n>``), not through
    # one of vLLM's HTTP routes (which log ``Received request <route>-<id>``), and the conversation
    # is the same: each prompt extends the previous one, served from the engine's prefix cache.
    # A stock vLLM (no tokens-in route) is enough.
    engine = engines["stock"]
    target = Target("in-process", "engine", engine, engine.url + "/v1", engine.ws_url)
    hits: list[float] = []
    responses = conversation(target, 3, hits, temperature=0, max_output_tokens=8)
    assert_continued(responses, hits)
    assert all(r["status"] == "incomplete" and r["usage"]["output_tokens"] == 8 for r in responses)
    for response in responses:
        mine = engine.lines_about(response["id"])
        assert any(f"Added request {response['id']}-" in line for line in mine), mine
        assert not any("Received request" in line for line in mine), mine


def test_the_middlewares_records_are_in_vllms_log(engines: dict[str, VllmProcess]) -> None:
    # Inside ``vllm serve`` the package's records (here the line per turn, at vLLM's default INFO)
    # go to vLLM's handler as vLLM's own lines; left to the root logger they were dropped.
    engine = engines["stock"]
    target = Target("in-process", "engine", engine, engine.url + "/v1", engine.ws_url)
    (response,) = conversation(target, 1, [], temperature=0, max_output_tokens=4)
    ours = f"turn {response['id']} incomplete"

    def logged() -> list[str]:
        return [line for line in engine.lines_about(response["id"]) if ours in line]

    wait_for(lambda: bool(logged()), "the line per turn in vLLM's log")
    (line,) = logged()
    assert line.startswith("(APIServer pid=") and " INFO " in line, line
