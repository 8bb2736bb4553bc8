"""The vLLM/SGLang backend against the realistic engine fakes on loopback (real httpx, real
uvicorn): the request bodies field by field, each endpoint's stream, fail-over, cancellation
and error mapping."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest
from responses_cache_vllm import EngineBackend, HandshakeError
from websockets.sync.client import connect

from responses_cache import create_app, get_renderer
from responses_cache.backends import load_backend
from responses_cache.engine_http import engine_transport
from responses_cache.testing import Behaviour, FakeSglang, FakeVllm, start_once

TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
CALL = (
    "<|channel|>analysis<|message|>List the files — ünïcödé 🚀.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json<|message|>"
    '{"cmd": "ls"}<|call|>'
)
ANSWER = "<|channel|>final<|message|>There are two files.<|return|>"
HARMONY = get_renderer("harmony")
ENC = HARMONY.encoding
STOPS = [ENC.encode_single_token("<|return|>"), ENC.encode_single_token("<|call|>")]


def _turn(ws: Any, **body: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", "model": "gpt-oss", "tools": TOOLS, **body}))
    while (event := json.loads(ws.recv(timeout=30)))["type"] not in (
        "response.completed", "response.failed", "response.incomplete", "error"
    ):
        pass
    return dict(event)


def _serve(live: Any, *engines: Any, name: str = "vllm", renderer: str = "harmony", **options: Any) -> Any:
    urls = [f"http://127.0.0.1:{live(e.app()).port}" if not isinstance(e, str) else e for e in engines]
    options.setdefault("template", renderer)
    backend = load_backend(name, base_urls=urls, model="openai/gpt-oss-20b", served_models=["gpt-oss"], **options)
    return live(create_app(backend=backend, renderer=renderer))


def _tool_loop(server: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    with connect(server.ws_url, max_size=None) as ws:
        first = _turn(ws, input="What is in this directory?", store=False, max_output_tokens=500)
        call = first["response"]["output"][1]
        second = _turn(ws, store=False, previous_response_id=first["response"]["id"],
                       input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt\nb.txt"}])
    return first, second


def _check_loop(engine: Any, first: dict[str, Any], second: dict[str, Any], prompt_field: str) -> None:
    output = first["response"]["output"]
    assert [o["type"] for o in output] == ["reasoning", "function_call"]
    assert output[0]["content"][0]["text"] == "List the files — ünïcödé 🚀."
    assert output[1]["name"] == "exec_command" and json.loads(output[1]["arguments"]) == {"cmd": "ls"}
    assert second["response"]["status"] == "completed"
    assert second["response"]["output"][0]["content"][0]["text"] == "There are two files."
    one, two = (r.body for r in engine.generation_requests())
    # The continuation extends the first prompt by exactly the sampled ids, the stop id included.
    sampled = ENC.encode(CALL, allowed_special="all")
    assert two[prompt_field][: len(one[prompt_field]) + len(sampled)] == one[prompt_field] + sampled
    assert engine.unknown_fields == []
    assert engine.closed_early == 0


# -- vLLM ------------------------------------------------------------------------------------


def test_vllm_generate_route_request_fields_and_tool_loop(responses_cache_server_factory: Any) -> None:
    engine = FakeVllm(ENC, [CALL, ANSWER])
    first, second = _tool_loop(_serve(responses_cache_server_factory, engine))
    _check_loop(engine, first, second, "token_ids")
    requests = engine.generation_requests()
    assert {r.path for r in requests} == {"/inference/v1/generate"}
    body = requests[0].body
    assert set(body) == {"request_id", "model", "token_ids", "sampling_params", "stream", "stream_options", "cache_salt"}
    assert body["model"] == "openai/gpt-oss-20b" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["request_id"] == first["response"]["id"]
    assert body["sampling_params"] == {
        "stop_token_ids": STOPS, "skip_special_tokens": False, "detokenize": False, "max_tokens": 500,
    }
    # No client limit: what the context window (max_model_len from /v1/models) leaves.
    second_body = requests[1].body
    assert second_body["sampling_params"]["max_tokens"] == engine.max_model_len - len(second_body["token_ids"])
    # The tokenizer handshake ran at start, on the documented /tokenize fields.
    tokenize = [r for r in engine.requests if r.path == "/tokenize"]
    assert len(tokenize) == 1 and set(tokenize[0].body) == {"model", "prompt", "add_special_tokens"}
    # Cached tokens grow from turn 2 (reported by the engine's final usage chunk).
    assert second["response"]["usage"]["input_tokens_details"]["cached_tokens"] >= len(body["token_ids"]) // 16 * 16 - 16


def test_vllm_completions_fallback_multi_token_chunks_and_held_back_text(responses_cache_server_factory: Any) -> None:
    engine = FakeVllm(ENC, [CALL, ANSWER], generate_route=False)
    engine.default = Behaviour(chunk_tokens=4, hold_back=True)
    first, second = _tool_loop(_serve(responses_cache_server_factory, engine))
    _check_loop(engine, first, second, "prompt")
    body = engine.generation_requests()[0].body
    assert engine.generation_requests()[0].path == "/v1/completions"
    assert set(body) == {"request_id", "model", "prompt", "stream", "stream_options", "skip_special_tokens", "cache_salt",
                         "stop_token_ids", "max_tokens", "return_token_ids"}
    assert body["stop_token_ids"] == STOPS and body["return_token_ids"] is True and body["skip_special_tokens"] is False


def test_vllm_without_scale_out_falls_back_to_completions_and_says_why(
    responses_cache_server_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A stock `vllm serve` (0.32+): the tokens-in route answers 403 until --enable-scale-out.
    engine = FakeVllm(ENC, [CALL, ANSWER], scale_out=False)
    with caplog.at_level("WARNING", logger="responses_cache.vllm"):
        first, second = _tool_loop(_serve(responses_cache_server_factory, engine))
    _check_loop(engine, first, second, "prompt")
    assert [r.path for r in engine.generation_requests()] == ["/v1/completions"] * 2
    assert any("--enable-scale-out" in r.getMessage() and "403" in r.getMessage() for r in caplog.records)


def test_vllm_restarted_without_scale_out_falls_back_mid_life(responses_cache_server_factory: Any) -> None:
    engine = FakeVllm(ENC, [CALL, ANSWER])
    server = _serve(responses_cache_server_factory, engine)
    with connect(server.ws_url, max_size=None) as ws:
        first = _turn(ws, input="What is in this directory?", store=False)
        engine.scale_out = False  # the engine came back as a stock server
        call = first["response"]["output"][1]
        second = _turn(ws, store=False, previous_response_id=first["response"]["id"],
                       input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"}])
    assert second["response"]["status"] == "completed", second
    # The turn's 403 is retried on /v1/completions before anything reached the client.
    assert [r.path for r in engine.generation_requests()] == [
        "/inference/v1/generate", "/inference/v1/generate", "/v1/completions"]


def test_vllm_generate_endpoint_on_a_stock_server_refuses_to_start(responses_cache_server_factory: Any) -> None:
    engine = FakeVllm(ENC, [ANSWER], scale_out=False)
    url = f"http://127.0.0.1:{responses_cache_server_factory(engine.app()).port}"
    backend = EngineBackend(url, model="openai/gpt-oss-20b", endpoint="generate", template="harmony")
    with pytest.raises(RuntimeError, match="--enable-scale-out"):
        start_once(backend)


def test_vllm_completions_without_ids_parses_the_engines_text(responses_cache_server_factory: Any) -> None:
    # An engine that gives no ids: the text (stop token left out, held back across chunks) is
    # parsed, and the assistant turn is rendered from the output items.
    engine = FakeVllm(ENC, [CALL, ANSWER], generate_route=False)
    engine.default = Behaviour(chunk_tokens=2, hold_back=True)
    server = _serve(responses_cache_server_factory, engine, return_token_ids=False)
    first, second = _tool_loop(server)
    assert [o["type"] for o in first["response"]["output"]] == ["reasoning", "function_call"]
    assert second["response"]["output"][0]["content"][0]["text"] == "There are two files."
    assert "return_token_ids" not in engine.generation_requests()[0].body


# -- SGLang ----------------------------------------------------------------------------------


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_sglang_generate_frames(responses_cache_server_factory: Any, incremental: bool) -> None:
    engine = FakeSglang(ENC, [CALL, ANSWER], incremental_output=incremental)
    first, second = _tool_loop(_serve(responses_cache_server_factory, engine, name="sglang"))
    _check_loop(engine, first, second, "input_ids")
    request = engine.generation_requests()[0]
    assert request.path == "/generate"
    assert set(request.body) == {"rid", "input_ids", "sampling_params", "stream", "cache_salt"}
    assert request.body["sampling_params"] == {
        "stop_token_ids": STOPS, "skip_special_tokens": False, "no_stop_trim": True, "max_new_tokens": 500,
    }
    assert request.headers["x-smg-routing-key"] and request.headers["x-smg-routing-key"] == \
        engine.generation_requests()[1].headers["x-smg-routing-key"]


def test_sglang_completions_endpoint(responses_cache_server_factory: Any) -> None:
    engine = FakeSglang(ENC, [CALL, ANSWER])
    first, second = _tool_loop(_serve(responses_cache_server_factory, engine, name="sglang", endpoint="completions"))
    _check_loop(engine, first, second, "prompt")
    body = engine.generation_requests()[0].body
    assert set(body) == {"rid", "model", "prompt", "stream", "stream_options", "skip_special_tokens", "cache_salt",
                         "stop_token_ids", "max_tokens", "return_token_ids", "no_stop_trim"}


# -- errors ----------------------------------------------------------------------------------


def _one(live: Any, engine: Any, **options: Any) -> dict[str, Any]:
    server = _serve(live, engine, **options)
    with connect(server.ws_url) as ws:
        return _turn(ws, input="hi")


@pytest.mark.parametrize(
    ("behaviour", "status", "code", "words"),
    [
        (Behaviour(status=400, message="This model's maximum context length is 8192 tokens. However, you requested 9000 tokens."),
         400, "context_length_exceeded", "context window"),
        (Behaviour(status=429, message="Too many requests", retry_after="7"), 429, "rate_limit_exceeded", "retry after 7s"),
        (Behaviour(status=500, message="Internal engine failure"), 502, "server_error", "Internal engine failure"),
    ],
    ids=["context-length", "429", "500"],
)
@pytest.mark.parametrize("generate_route", [True, False], ids=["generate", "completions"])
def test_an_engine_refusal_is_an_error_before_the_response(
    responses_cache_server_factory: Any, behaviour: Behaviour, status: int, code: str, words: str, generate_route: bool
) -> None:
    # Before the engine accepted the request nothing exists yet: the client gets the plain error
    # the same body would get over HTTP (response.failed takes only generation-failure codes).
    engine = FakeVllm(ENC, [ANSWER], generate_route=generate_route)
    engine.behaviours = [behaviour]
    refused = _one(responses_cache_server_factory, engine)
    assert refused["type"] == "error" and refused["status"] == status, refused
    assert refused["error"]["code"] == code and words in refused["error"]["message"], refused


@pytest.mark.parametrize(
    ("behaviour", "words"),
    [
        (Behaviour(error_after=1, message="CUDA out of memory"), "CUDA out of memory"),
        (Behaviour(finish_reason="abort"), "aborted"),
        (Behaviour(finish_reason="repetition"), "repetition"),
        (Behaviour(finish_reason="error"), "error"),
    ],
    ids=["error-chunk", "abort", "repetition", "error"],
)
@pytest.mark.parametrize("generate_route", [True, False], ids=["generate", "completions"])
def test_engine_failures_mid_stream_fail_the_response(
    responses_cache_server_factory: Any, behaviour: Behaviour, words: str, generate_route: bool
) -> None:
    engine = FakeVllm(ENC, [ANSWER], generate_route=generate_route)
    engine.behaviours = [behaviour]
    failed = _one(responses_cache_server_factory, engine)
    assert failed["type"] == "response.failed", failed["type"]
    error = failed["response"]["error"]
    assert error["code"] == "server_error" and words in error["message"], error


def test_length_is_incomplete_not_failed(responses_cache_server_factory: Any) -> None:
    engine = FakeVllm(ENC, [ANSWER])
    server = _serve(responses_cache_server_factory, engine)
    with connect(server.ws_url) as ws:
        done = _turn(ws, input="hi", max_output_tokens=4)
    assert done["type"] == "response.incomplete"
    assert done["response"]["incomplete_details"]["reason"] == "max_output_tokens"


def test_a_prompt_longer_than_the_window_is_refused_before_the_engine(responses_cache_server_factory: Any) -> None:
    # The engine's window (max_model_len, read at start) is the route's limit: a plain 400 error
    # before the response exists, as for any prompt over the window.
    engine = FakeVllm(ENC, [ANSWER], max_model_len=40)
    refused = _one(responses_cache_server_factory, engine)
    assert refused["type"] == "error" and refused["status"] == 400, refused
    assert refused["error"]["code"] == "context_length_exceeded" and "40 tokens" in refused["error"]["message"]
    assert engine.generation_requests() == []


# -- placement and fail-over -----------------------------------------------------------------


def _dead_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed again: connections are refused


def test_refused_connection_and_503_fail_over_before_the_first_token(responses_cache_server_factory: Any) -> None:
    busy = FakeVllm(ENC, [ANSWER])
    busy.default = Behaviour(status=503, message="no capacity")
    good = FakeVllm(ENC, [ANSWER])
    server = _serve(responses_cache_server_factory, busy, _dead_url(), good)
    with connect(server.ws_url) as ws:
        for i in range(6):  # several conversations: whichever replica owns them, they land on `good`
            done = _turn(ws, input=f"conversation {i}")
            assert done["type"] == "response.completed"
    assert len(good.generation_requests()) == 6


def test_no_replica_left_is_an_error_before_the_response(responses_cache_server_factory: Any) -> None:
    busy = FakeVllm(ENC, [ANSWER])
    busy.default = Behaviour(status=503, message="no capacity")
    server = _serve(responses_cache_server_factory, busy, _dead_url(), endpoint="generate", context_window=4096, handshake=False)
    with connect(server.ws_url) as ws:
        refused = _turn(ws, input="hi")
    assert refused["type"] == "error" and refused["status"] == 502 and refused["error"]["code"] == "server_error"
    message = refused["error"]["message"]
    assert "no vllm replica could take the request" in message and "no capacity" in message
    assert len(busy.generation_requests()) == 1


def test_a_failure_after_the_first_token_fails_the_response_without_retry(responses_cache_server_factory: Any) -> None:
    first = FakeVllm(ENC, [ANSWER])
    second = FakeVllm(ENC, [ANSWER])
    for engine in (first, second):
        engine.default = Behaviour(chunk_tokens=1, error_after=2, message="engine died")
    server = _serve(responses_cache_server_factory, first, second)
    with connect(server.ws_url) as ws:
        failed = _turn(ws, input="hi")
    assert failed["type"] == "response.failed"
    assert "engine died" in failed["response"]["error"]["message"]
    assert len(first.generation_requests()) + len(second.generation_requests()) == 1


def test_client_disconnect_closes_the_engine_stream(responses_cache_server_factory: Any) -> None:
    engine = FakeVllm(ENC, [ANSWER])
    engine.default = Behaviour(chunk_tokens=1, hang_after=4)
    server = _serve(responses_cache_server_factory, engine)
    with connect(server.ws_url) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-oss", "input": "hi"}))
        while json.loads(ws.recv(timeout=30))["type"] != "response.output_text.delta":
            pass
    deadline = time.monotonic() + 10
    while engine.closed_early == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.closed_early == 1 and engine.completed == 0


@pytest.mark.parametrize("pool", ["aiohttp", "httpcore"])
@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_every_turn_hands_the_engine_connection_back(responses_cache_server_factory: Any, name: str, pool: str) -> None:
    """A pool of two connections carries a dozen turns: each turn's stream goes back to the pool
    once it ends (a stream left checked out, one a turn, emptied the default pool of 100 after
    100 turns, and every later turn waited for the pool's timeout and failed). Both pools: the
    adapters' own (aiohttp's, :func:`engine_transport`) and httpx's, which a user may pass."""
    fake = FakeVllm if name == "vllm" else FakeSglang
    engine = fake(ENC, [ANSWER] * 12)
    limits = httpx.Limits(max_connections=2)
    transport = engine_transport(limits) if pool == "aiohttp" else httpx.AsyncHTTPTransport(limits=limits)
    client = httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(30, pool=5))
    server = _serve(responses_cache_server_factory, engine, name=name, client=client)
    with connect(server.ws_url, max_size=None) as ws:
        previous = None
        for n in range(12):
            done = _turn(ws, input=f"Turn {n}.", store=False, previous_response_id=previous)
            assert done["type"] == "response.completed", (n, done)
            previous = done["response"]["id"]


def test_handshake_refuses_an_engine_with_another_vocabulary(responses_cache_server_factory: Any) -> None:
    engine = FakeVllm(ENC, [ANSWER], tokenize_offset=1)
    upstream = responses_cache_server_factory(engine.app())
    backend = EngineBackend(f"http://127.0.0.1:{upstream.port}", model=engine.model, template="harmony")
    with pytest.raises(HandshakeError, match="tokenizes differently"):
        start_once(backend)
    same = FakeVllm(ENC, [ANSWER])
    ok = EngineBackend(f"http://127.0.0.1:{responses_cache_server_factory(same.app()).port}", model=same.model, template="harmony")
    start_once(ok)
    assert ok.dialect is not None and ok.dialect.name == "vllm-generate" and ok.context_window == same.max_model_len


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # uvicorn exits its thread
def test_a_server_in_front_of_another_vocabulary_refuses_to_start(responses_cache_server_factory: Any) -> None:
    engine = FakeVllm(ENC, [ANSWER], tokenize_offset=7)
    with pytest.raises(RuntimeError, match="did not start"):
        _serve(responses_cache_server_factory, engine)
    assert [r.path for r in engine.requests] == ["/inference/v1/generate", "/v1/models", "/tokenize"]


def test_factory_needs_an_engine_address() -> None:
    with pytest.raises(ValueError, match="base_urls and model"):
        load_backend("sglang")


# -- priority --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "options", "path"),
    [("vllm", {}, "/inference/v1/generate"), ("vllm", {"endpoint": "completions"}, "/v1/completions"),
     ("sglang", {}, "/generate"), ("sglang", {"endpoint": "completions"}, "/v1/completions")],
)
def test_the_requests_priority_reaches_the_engine(
    responses_cache_server_factory: Any, name: str, options: dict[str, Any], path: str
) -> None:
    engine = (FakeVllm if name == "vllm" else FakeSglang)(ENC, [ANSWER])
    server = _serve(responses_cache_server_factory, engine, name=name, **options)
    with connect(server.ws_url) as ws:
        assert _turn(ws, input="hi", priority=-5)["type"] == "response.completed"
        assert _turn(ws, input="hi")["type"] == "response.completed"
    with_priority, without = (r.body for r in engine.generation_requests())
    assert engine.generation_requests()[0].path == path
    assert with_priority["priority"] == -5  # the engine's own field, at the top level
    assert "priority" not in without  # unset: never sent (a stock engine refuses a non-zero one)
    assert engine.unknown_fields == []
