"""Steering through the vLLM adapter: the steered request is aborted (its HTTP stream closed) and
the successor is one more request on the extended token log — the target's prompt and output,
then the steering message — so the engine's prefix cache covers everything before it."""

from __future__ import annotations

import threading
from typing import Any

from responses_cache import create_app, get_renderer
from responses_cache.backends import load_backend
from responses_cache.testing import Behaviour, FakeVllm, steer_mid_answer, wait_for

HARMONY = get_renderer("harmony")
ENC = HARMONY.encoding
LONG = "<|channel|>final<|message|>" + "word " * 1500 + "<|return|>"
SHORT = "<|channel|>final<|message|>Brief.<|return|>"


def test_a_steer_aborts_the_engine_request_and_the_successor_extends_its_log(responses_cache_server_factory: Any) -> None:
    engine = FakeVllm(ENC, [LONG, SHORT])
    # After a few tokens the target's stream gives one token per release of the gate: one after
    # the steer is accepted (the steer always lands mid-answer), then none. A stream nobody
    # closes stays open, stalled; a steer that stops nothing leaves the target unfinished.
    gate = threading.Semaphore(0)
    engine.behaviours = [Behaviour(chunk_tokens=1, hang_after=8, gate=gate)]
    engine.default = Behaviour(chunk_tokens=1)
    url = f"http://127.0.0.1:{responses_cache_server_factory(engine.app()).port}"
    backend = load_backend("vllm", base_urls=[url], model="openai/gpt-oss-20b", served_models=["gpt-oss"], template="harmony")
    server = responses_cache_server_factory(create_app(backend=backend, renderer="harmony"))
    first, second = steer_mid_answer(server.ws_url, gate, model="gpt-oss", input="Write at length.", steer="Stop; one word.")
    assert second["previous_response_id"] == first["id"]
    assert first["status"] == "incomplete" and first["incomplete_details"] == {"reason": "steered"}
    assert second["status"] == "completed"
    # The engine's stream for the target was closed before its end; only the successor's finished.
    wait_for(lambda: engine.closed_early == 1, "the steered request's stream was never closed")
    assert engine.completed == 1
    bodies = [r.body for r in engine.generation_requests()]
    assert len(bodies) == 2
    target_prompt, successor_prompt = bodies[0]["token_ids"], bodies[1]["token_ids"]
    assert successor_prompt[: len(target_prompt)] == target_prompt  # appended, not re-rendered
    tail = ENC.decode(successor_prompt[len(target_prompt):])
    assert "Stop; one word." in tail
    (message,) = first["output"]
    text = message["content"][0]["text"]
    assert message["status"] == "incomplete" and 1 <= text.count("word") < 1500
    assert "<|message|>" + text + "<|end|>" in tail  # the cut answer, as sent
    assert second["usage"]["input_tokens_details"]["cached_tokens"] >= len(target_prompt) - len(target_prompt) % engine.block_size
