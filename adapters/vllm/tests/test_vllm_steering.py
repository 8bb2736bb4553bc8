"""Steering through the vLLM adapter: the steered request is aborted (its HTTP stream closed) and
the successor is one more request on the extended token log — the target's prompt and output,
then the steering message — so the engine's prefix cache covers everything before it."""

from __future__ import annotations

import json
from typing import Any

from websockets.sync.client import connect

from responses_cache import create_app, get_renderer
from responses_cache.backends import load_backend
from responses_cache.testing import Behaviour, FakeVllm

HARMONY = get_renderer("harmony")
ENC = HARMONY.encoding
LONG = "<|channel|>final<|message|>" + "word " * 1500 + "<|return|>"
SHORT = "<|channel|>final<|message|>Brief.<|return|>"


def test_a_steer_aborts_the_engine_request_and_the_successor_extends_its_log(responses_cache_server_factory: Any) -> None:
    engine = FakeVllm(ENC, [LONG, SHORT])
    engine.default = Behaviour(chunk_tokens=1)
    url = f"http://127.0.0.1:{responses_cache_server_factory(engine.app()).port}"
    backend = load_backend("vllm", base_urls=[url], model="openai/gpt-oss-20b", served_models=["gpt-oss"], template="harmony")
    server = responses_cache_server_factory(create_app(backend=backend, renderer="harmony"))
    with connect(server.ws_url, max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-oss", "input": "Write at length."}))
        events = []
        while (event := json.loads(ws.recv()))["type"] != "response.output_text.delta":
            events.append(event)
        target = events[0]["response"]["id"]
        ws.send(json.dumps({"type": "response.steer", "previous_response_id": target, "input": "Stop; one word."}))
        ends: list[dict[str, Any]] = []
        while len(ends) < 2:
            event = json.loads(ws.recv())
            if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                ends.append(event["response"])
    first, second = ends
    assert first["id"] == target and second["previous_response_id"] == target
    assert second["status"] == "completed"
    bodies = [r.body for r in engine.generation_requests()]
    assert len(bodies) == 2
    target_prompt, successor_prompt = bodies[0]["token_ids"], bodies[1]["token_ids"]
    assert successor_prompt[: len(target_prompt)] == target_prompt  # appended, not re-rendered
    tail = ENC.decode(successor_prompt[len(target_prompt):])
    assert "Stop; one word." in tail
    if first["status"] == "incomplete":  # the usual case: the steer landed mid-answer
        assert first["incomplete_details"] == {"reason": "steered"}
        (message,) = first["output"]
        assert message["status"] == "incomplete" and message["content"][0]["text"].count("word") < 1500
        assert "<|message|>" + message["content"][0]["text"] + "<|end|>" in tail  # the cut answer, as sent
    assert second["usage"]["input_tokens_details"]["cached_tokens"] >= len(target_prompt) - len(target_prompt) % engine.block_size
