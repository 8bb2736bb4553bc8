"""The vLLM/SGLang backend against a fake OpenAI-compatible completions server on loopback.

The fake engine checks what a real one would receive (a token-id prompt, the stop ids, special
tokens kept) and streams a scripted harmony completion with its token ids, as vLLM does with
``return_token_ids``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from websockets.sync.client import connect

from responses_cache import create_app
from responses_cache.backends import load_backend
from responses_cache.tokens import get_renderer

TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
CALL = (
    "<|channel|>analysis<|message|>List the files.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json<|message|>"
    '{"cmd": "ls"}<|call|>'
)
ANSWER = "<|channel|>final<|message|>There are two files.<|return|>"


class FakeEngine:
    def __init__(self, script: list[str], *, status: int = 200, hold: bool = False) -> None:
        self.script = script
        self.status = status
        self.hold = hold
        self.bodies: list[dict[str, Any]] = []
        self.disconnected = asyncio.Event()
        self.encoding = get_renderer("harmony").encoding

    def app(self) -> Starlette:
        async def completions(request: Request) -> Any:
            body = await request.json()
            self.bodies.append(body)
            if self.status != 200:
                return JSONResponse({"error": {"message": "prompt too long", "type": "BadRequestError"}}, self.status)
            text = self.script[min(len(self.bodies) - 1, len(self.script) - 1)]
            ids = self.encoding.encode(text, allowed_special="all")

            async def stream() -> AsyncIterator[bytes]:
                try:
                    for i, token in enumerate(ids):
                        if self.hold and i == 5:  # after a couple of text tokens
                            await asyncio.sleep(30)  # a slow engine; the client goes away meanwhile
                        done = i == len(ids) - 1
                        choice = {"index": 0, "text": self.encoding.decode([token]), "token_ids": [token],
                                  "finish_reason": "stop" if done else None}
                        yield f"data: {json.dumps({'choices': [choice]})}\n\n".encode()
                    usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids),
                             "prompt_tokens_details": {"cached_tokens": 0}}
                    yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
                    yield b"data: [DONE]\n\n"
                except asyncio.CancelledError:
                    self.disconnected.set()
                    raise

            return StreamingResponse(stream(), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def _turn(ws: Any, **body: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", "model": "gpt-oss", "tools": TOOLS, **body}))
    while (event := json.loads(ws.recv()))["type"] not in ("response.completed", "response.failed", "error"):
        pass
    return dict(event)


def _server(responses_cache_server_factory: Any, engine: FakeEngine) -> Any:
    upstream = responses_cache_server_factory(engine.app())
    backend = load_backend("vllm", base_urls=f"http://127.0.0.1:{upstream.port}", model="gpt-oss-20b",
                           served_models=["gpt-oss"])
    return responses_cache_server_factory(create_app(backend=backend, renderer="harmony"))


def test_tool_loop_sends_token_prompts_and_keeps_sampled_ids(responses_cache_server_factory: Any) -> None:
    engine = FakeEngine([CALL, ANSWER])
    server = _server(responses_cache_server_factory, engine)
    renderer = get_renderer("harmony")
    with connect(server.ws_url, max_size=None) as ws:
        first = _turn(ws, input="What is in this directory?", store=False)
        output = first["response"]["output"]
        assert [o["type"] for o in output] == ["reasoning", "function_call"]
        assert output[0]["content"][0]["text"] == "List the files."
        assert output[1]["name"] == "exec_command" and json.loads(output[1]["arguments"]) == {"cmd": "ls"}
        second = _turn(ws, store=False, previous_response_id=first["response"]["id"],
                       input=[{"type": "function_call_output", "call_id": output[1]["call_id"], "output": "a.txt\nb.txt"}])
    assert second["response"]["output"][0]["content"][0]["text"] == "There are two files."
    one, two = engine.bodies
    assert one["model"] == "gpt-oss-20b" and one["skip_special_tokens"] is False
    enc = renderer.encoding
    assert one["stop_token_ids"] == [enc.encode_single_token("<|return|>"), enc.encode_single_token("<|call|>")]
    # The continuation's prompt extends the first prompt by exactly what the engine sampled
    # (kept as those ids), then the tool output: the engine's prefix cache sees an exact prefix.
    sampled = enc.encode(CALL, allowed_special="all")
    assert two["prompt"][: len(one["prompt"]) + len(sampled)] == one["prompt"] + sampled
    assert second["response"]["usage"]["input_tokens_details"]["cached_tokens"] >= len(one["prompt"])


def test_engine_errors_fail_the_response(responses_cache_server_factory: Any) -> None:
    server = _server(responses_cache_server_factory, FakeEngine([ANSWER], status=400))
    with connect(server.ws_url) as ws:
        failed = _turn(ws, input="hi")
    assert failed["type"] == "response.failed"
    assert "HTTP 400" in failed["response"]["error"]["message"] and "prompt too long" in failed["response"]["error"]["message"]


def test_client_disconnect_cancels_the_engine_request(responses_cache_server_factory: Any) -> None:
    engine = FakeEngine([ANSWER], hold=True)
    server = _server(responses_cache_server_factory, engine)
    with connect(server.ws_url) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-oss", "input": "hi"}))
        while json.loads(ws.recv())["type"] != "response.output_text.delta":
            pass
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(asyncio.wait_for(_wait(engine), 10))
    finally:
        loop.close()


async def _wait(engine: FakeEngine) -> bool:
    while not engine.disconnected.is_set():
        await asyncio.sleep(0.01)
    return True


def test_factory_needs_an_engine_address() -> None:
    with pytest.raises(ValueError, match="base_urls and model"):
        load_backend("sglang")
