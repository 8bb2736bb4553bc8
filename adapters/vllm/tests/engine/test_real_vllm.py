"""The vLLM adapter against a real vLLM (CPU build, tiny random-weight model): in both modes
(``responses-cache`` in front of the engine, and the middleware inside it) and on both endpoints
(the tokens-in route with ``--enable-scale-out``, ``/v1/completions`` on a stock server).

The model's answers are noise; what is real is the engine: its HTTP API, token ids, streaming,
usage, prefix cache, context limit and aborts. Every frame the SDK receives is validated strictly.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from engine_suite import ENDLESS, KEY, MODEL, Target, network_backend, sdk, turn
from responses_cache_vllm import HandshakeError
from websockets.sync.client import connect

from benchmarks.suite.vllmproc import VllmProcess
from responses_cache import create_app
from tests.websocket.wsclient import check_event

pytestmark = pytest.mark.engine

def conversation(target: Target, turns: int, **body: Any) -> list[dict[str, Any]]:
    with sdk(target.http_url) as client, client.responses.connect() as conn:
        responses: list[dict[str, Any]] = []
        for n in range(turns):
            previous = responses[-1]["id"] if responses else None
            responses.append(turn(conn, input=f"Turn {n}: say something about {n * 7}.", previous_response_id=previous,
                                  **body))
    return responses


def assert_cache_grows(responses: list[dict[str, Any]]) -> None:
    """Each continuation's prompt extends the previous one: the engine's prefix cache holds at
    least the previous prompt (to its block), and the hit grows turn over turn."""
    cached = [r["usage"]["input_tokens_details"]["cached_tokens"] for r in responses]
    inputs = [r["usage"]["input_tokens"] for r in responses]
    for n in range(1, len(responses)):
        assert inputs[n - 1] // 16 * 16 <= cached[n] <= inputs[n], (inputs, cached)
    assert cached[1:] == sorted(set(cached[1:])), cached


def test_turns_end_normally_and_the_prefix_cache_grows(target: Target) -> None:
    responses = conversation(target, 4)
    assert [r["status"] for r in responses] == ["completed"] * 4
    # The tiny model answers in harmony's final channel, "Hello" and noise.
    assert all(r["output"][-1]["content"][0]["text"].startswith("Hello") for r in responses), responses
    assert_cache_grows(responses)


def test_max_output_tokens_ends_a_response_incomplete(target: Target) -> None:
    (response,) = conversation(target, 1, temperature=0, max_output_tokens=20)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["output_tokens"] == 20


def test_a_prompt_over_the_context_window_is_context_length_exceeded(target: Target) -> None:
    long_input = "lorem " * 5000  # ~5,000 tokens against max_model_len 4096
    with sdk(target.http_url) as client, client.responses.connect() as conn:
        conn.response.create(model=MODEL, store=False, input=long_input)
        event = json.loads(conn.recv_bytes())
        check_event(event)
        assert event["type"] == "error" and event["error"]["code"] == "context_length_exceeded", event
        # The socket stays usable.
        assert turn(conn, input="short")["status"] == "completed"


def test_max_output_tokens_is_capped_by_the_context_window(target: Target) -> None:
    # No max_output_tokens: the engine may write up to what the window leaves, and no more.
    prompt = "lorem " * 3950
    with sdk(target.http_url) as client, client.responses.connect() as conn:
        response = turn(conn, input=prompt, temperature=0)
    usage = response["usage"]
    assert response["status"] == "incomplete", response.get("error")
    assert usage["input_tokens"] + usage["output_tokens"] == target.engine.max_model_len


def _running(engine: VllmProcess) -> float:
    return engine.metrics()["vllm:num_requests_running"]


def _aborted(engine: VllmProcess) -> float:
    return engine.metrics()["vllm:request_success_total{finished_reason=abort}"]


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_client_leaving_mid_stream_aborts_the_engine_request(target: Target) -> None:
    aborted = _aborted(target.engine)
    with connect(target.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "Go on forever.", **ENDLESS}))
        deltas = 0
        while deltas < 5:
            event = json.loads(ws.recv(timeout=60))
            check_event(event)
            deltas += event["type"] == "response.output_text.delta"
        assert _running(target.engine) == 1
    _wait(lambda: _running(target.engine) == 0 and _aborted(target.engine) == aborted + 1, "the engine's abort")


def test_steering_aborts_the_engine_request_and_the_successor_continues_it(target: Target) -> None:
    aborted = _aborted(target.engine)
    events: list[dict[str, Any]] = []

    def until(kind: str) -> dict[str, Any]:
        while True:
            event = json.loads(ws.recv(timeout=60))
            check_event(event)
            events.append(event)
            if event["type"] == kind:
                return event

    with connect(target.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "Write a long story.", **ENDLESS}))
        target_id = until("response.created")["response"]["id"]
        until("response.output_text.delta")
        steer = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Stop. Be brief."}]}]
        ws.send(json.dumps({"type": "response.steer", "previous_response_id": target_id, "input": steer}))
        until("response.steer.accepted")
        steered = until("response.incomplete")["response"]
        # The successor is greedy too (it inherits the target's settings): stop it by its own limit.
        successor = until("response.incomplete")["response"]
    assert steered["incomplete_details"] == {"reason": "steered"}
    assert successor["previous_response_id"] == target_id
    assert successor["incomplete_details"] == {"reason": "max_output_tokens"}
    # The engine's request was aborted, and the successor's prompt is the target's prompt, the
    # sampled answer so far and the steering message: the engine's cache holds the target's prompt.
    assert _aborted(target.engine) == aborted + 1
    assert successor["usage"]["input_tokens_details"]["cached_tokens"] >= steered["usage"]["input_tokens"] // 16 * 16


def test_eight_concurrent_connections(target: Target) -> None:
    results: list[list[dict[str, Any]]] = []
    errors: list[BaseException] = []

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
        assert_cache_grows(responses)


# -- network mode only ---------------------------------------------------------------------------


def test_tenants_do_not_share_the_engines_prefix_cache(
    engines: dict[str, VllmProcess], responses_cache_server_factory: Callable[..., Any]
) -> None:
    # Per-tenant cache_salt: a second tenant's identical prompt is not a cache hit.
    server = responses_cache_server_factory(create_app(
        backend=network_backend(engines["scale_out"]), renderer="harmony", api_keys={"sk-a": "tenant-a", "sk-b": "tenant-b"}))
    prompt = "The quick brown fox jumps over the lazy dog. " * 20

    def cached(key: str) -> int:
        with sdk(server.http_url, key) as client, client.responses.connect() as conn:
            return int(turn(conn, input=prompt)["usage"]["input_tokens_details"]["cached_tokens"])

    cached("sk-a")
    assert cached("sk-a") >= 160  # the same tenant again: its prompt is cached
    assert cached("sk-b") == 0


def test_the_tokenizer_handshake_passes_and_a_wrong_template_refuses_to_start(
    engines: dict[str, VllmProcess],
) -> None:
    asyncio.run(network_backend(engines["scale_out"]).start())  # harmony on o200k_harmony: the same ids
    with pytest.raises(HandshakeError, match="tokenizes differently"):
        asyncio.run(network_backend(engines["scale_out"], template="chatml").start())


def test_the_engines_own_context_error_is_context_length_exceeded(
    engines: dict[str, VllmProcess], responses_cache_server_factory: Callable[..., Any]
) -> None:
    # A context window set larger than the engine's: the engine itself refuses the prompt.
    backend = network_backend(engines["scale_out"], context_window=100_000)
    server = responses_cache_server_factory(create_app(backend=backend, renderer="harmony", api_keys=[KEY]))
    with sdk(server.http_url) as client, client.responses.connect() as conn:
        conn.response.create(model=MODEL, store=False, input="lorem " * 5000, max_output_tokens=16)
        event = json.loads(conn.recv_bytes())
        check_event(event)
    assert event["type"] == "error" and event["error"]["code"] == "context_length_exceeded", event
