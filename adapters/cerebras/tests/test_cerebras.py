"""The Cerebras backend through the official SDK (``cerebras_cloud_sdk``) against the Cerebras
fake on loopback: the token path (harmony), the chat path (byte-stable messages), rate-limit
headers, error mapping and cancellation."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from responses_cache_cerebras import CerebrasBackend
from websockets.sync.client import connect

from responses_cache import InMemoryMetrics, create_app, get_renderer
from responses_cache.backends import load_backend
from responses_cache.testing import Behaviour, ChatReply, FakeCerebras
from responses_cache.testing.fake_engines import CEREBRAS_CHAT_FIELDS

TOOLS = [{"type": "function", "name": "exec_command", "description": "Run a command",
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
CALL = (
    "<|channel|>analysis<|message|>List the files.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json<|message|>"
    '{"cmd": "ls"}<|call|>'
)
ANSWER = "<|channel|>final<|message|>There are two files.<|return|>"
ENC = get_renderer("harmony").encoding
INSTRUCTIONS = "You are a careful coding agent. " * 40  # over one 128-token cache block


def _turn(ws: Any, **body: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", "model": "gpt-oss", "tools": TOOLS,
                        "instructions": INSTRUCTIONS, **body}))
    while (event := json.loads(ws.recv(timeout=30)))["type"] not in (
        "response.completed", "response.failed", "response.incomplete", "error"
    ):
        pass
    return dict(event)


def _backend(live: Any, engine: FakeCerebras, **options: Any) -> CerebrasBackend:
    url = f"http://127.0.0.1:{live(engine.app()).port}"
    options.setdefault("warm_tcp_connection", False)
    options.setdefault("max_retries", 0)
    backend = load_backend("cerebras", model="gpt-oss-120b", base_url=url, api_key="csk-test",
                           served_models=["gpt-oss"], **options)
    assert isinstance(backend, CerebrasBackend)
    return backend


def _loop(live: Any, backend: CerebrasBackend) -> tuple[dict[str, Any], dict[str, Any]]:
    server = live(create_app(backend=backend, renderer="harmony"))
    with connect(server.ws_url, max_size=None) as ws:
        first = _turn(ws, input="What is in this directory?", store=False)
        call = first["response"]["output"][-1]
        second = _turn(ws, store=False, previous_response_id=first["response"]["id"],
                       input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt\nb.txt"}])
    return first, second


def test_token_path_sends_token_prompts_and_parses_harmony(responses_cache_server_factory: Any) -> None:
    engine = FakeCerebras(ENC, [CALL, ANSWER])
    metrics = InMemoryMetrics()
    backend = _backend(responses_cache_server_factory, engine, metrics=metrics)
    first, second = _loop(responses_cache_server_factory, backend)
    output = first["response"]["output"]
    assert [o["type"] for o in output] == ["reasoning", "function_call"]
    assert output[1]["name"] == "exec_command" and json.loads(output[1]["arguments"]) == {"cmd": "ls"}
    assert second["response"]["output"][0]["content"][0]["text"] == "There are two files."
    one, two = (r.body for r in engine.generation_requests())
    assert set(one) == {"model", "prompt", "stream", "return_raw_tokens", "stop"}
    assert one["model"] == "gpt-oss-120b" and one["return_raw_tokens"] is True
    assert one["stop"] == ["<|return|>", "<|call|>"]
    assert engine.unknown_fields == []
    # The stop string is cut from the output; the adapter puts <|call|> back, so the
    # continuation extends the first prompt by exactly the sampled turn.
    sampled = ENC.encode(CALL, allowed_special="all")
    assert two["prompt"][: len(one["prompt"]) + len(sampled)] == one["prompt"] + sampled
    assert second["response"]["usage"]["input_tokens_details"]["cached_tokens"] >= 128
    # Rate-limit headers reach the metrics.
    assert backend.rate_limits["remaining-tokens-minute"] == 999_000
    count, total = metrics.summaries[("cerebras_ratelimit_remaining_tokens_minute", ())]
    assert count == 2 and total == 2 * 999_000
    assert engine.requests[0].headers["authorization"] == "Bearer csk-test"


def test_chat_path_is_byte_stable_and_keeps_reasoning(responses_cache_server_factory: Any) -> None:
    engine = FakeCerebras(ENC, chat_script=[
        ChatReply(reasoning="List the files first.", tool_calls=[("exec_command", '{"cmd": "ls"}')]),
        ChatReply(content="There are two files."),
    ])
    backend = _backend(responses_cache_server_factory, engine, modes={"gpt-oss": "chat"})
    first, second = _loop(responses_cache_server_factory, backend)
    output = first["response"]["output"]
    assert [o["type"] for o in output] == ["reasoning", "function_call"]
    assert output[1]["call_id"] == "call_cb1_0"  # the engine's call id, kept
    assert second["response"]["output"][0]["content"][0]["text"] == "There are two files."
    one, two = (r.body for r in engine.generation_requests())
    assert set(one) <= CEREBRAS_CHAT_FIELDS and engine.unknown_fields == []
    assert one["clear_thinking"] is False and one["parallel_tool_calls"] is True and one["tool_choice"] == "auto"
    assert one["tools"] == [{"type": "function", "function": {
        "name": "exec_command", "description": "Run a command", "parameters": TOOLS[0]["parameters"]}}]
    # Turn 2 resends turn 1 byte for byte, then the assistant turn (reasoning passed back, the
    # same call id and argument JSON) and the tool output.
    dump = lambda messages: json.dumps(messages, separators=(",", ":"))  # noqa: E731
    assert dump(two["messages"]).startswith(dump(one["messages"])[:-1])
    assert two["messages"][len(one["messages"])] == {
        "role": "assistant", "content": "", "reasoning": "List the files first.",
        "tool_calls": [{"id": "call_cb1_0", "type": "function", "function": {"name": "exec_command", "arguments": '{"cmd": "ls"}'}}],
    }
    assert two["messages"][-1] == {"role": "tool", "tool_call_id": "call_cb1_0", "content": "a.txt\nb.txt"}
    assert second["response"]["usage"]["input_tokens_details"]["cached_tokens"] > 0


@pytest.mark.parametrize(
    ("behaviour", "code", "words"),
    [
        (Behaviour(status=429, message="Tokens per minute limit exceeded", retry_after="3"), "rate_limit_exceeded", "retry after 3s"),
        (Behaviour(status=400, message="Please reduce the length of the messages or completion: maximum context length is 65536"),
         "context_length_exceeded", "context window"),
        (Behaviour(error_after=1, message="stream broke"), "server_error", "stream broke"),
    ],
    ids=["429", "context-length", "error-chunk"],
)
@pytest.mark.parametrize("mode", ["tokens", "chat"])
def test_errors_are_mapped(responses_cache_server_factory: Any, behaviour: Behaviour, code: str, words: str, mode: str) -> None:
    engine = FakeCerebras(ENC, [ANSWER])
    engine.behaviours = [behaviour]
    server = responses_cache_server_factory(create_app(backend=_backend(responses_cache_server_factory, engine, mode=mode), renderer="harmony"))
    with connect(server.ws_url) as ws:
        failed = _turn(ws, input="hi")
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == code and words in failed["response"]["error"]["message"]


def test_disconnect_closes_the_cerebras_stream(responses_cache_server_factory: Any) -> None:
    engine = FakeCerebras(ENC, [ANSWER])
    engine.default = Behaviour(chunk_tokens=1, hang_after=5)
    server = responses_cache_server_factory(create_app(backend=_backend(responses_cache_server_factory, engine), renderer="harmony"))
    with connect(server.ws_url) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-oss", "input": "hi"}))
        while json.loads(ws.recv(timeout=30))["type"] != "response.output_text.delta":
            pass
    deadline = time.monotonic() + 10
    while engine.closed_early == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.closed_early == 1


def test_the_sdk_warms_its_connection_unless_told_not_to(responses_cache_server_factory: Any) -> None:
    engine = FakeCerebras(ENC)
    _backend(responses_cache_server_factory, engine)
    assert [r.path for r in engine.requests] == []
    _backend(responses_cache_server_factory, engine, warm_tcp_connection=True)
    assert [r.path for r in engine.requests] == ["/v1/tcp_warming"]


def test_without_raw_tokens_the_text_is_parsed(responses_cache_server_factory: Any) -> None:
    engine = FakeCerebras(ENC, [CALL, ANSWER], raw_tokens=False)
    first, second = _loop(responses_cache_server_factory, _backend(responses_cache_server_factory, engine))
    assert [o["type"] for o in first["response"]["output"]] == ["reasoning", "function_call"]
    assert second["response"]["output"][0]["content"][0]["text"] == "There are two files."


def test_text_without_markers_fails_clearly(responses_cache_server_factory: Any) -> None:
    engine = FakeCerebras(ENC, [ANSWER], raw_tokens=False, special_tokens_in_text=False)
    server = responses_cache_server_factory(create_app(backend=_backend(responses_cache_server_factory, engine), renderer="harmony"))
    with connect(server.ws_url) as ws:
        failed = _turn(ws, input="hi")
    assert failed["type"] == "response.failed" and "use mode 'chat'" in failed["response"]["error"]["message"]
