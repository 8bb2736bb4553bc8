"""Steering through the Cerebras adapter (token path): the steered completion stream is dropped
and the successor is one more completion whose prompt extends the target's prompt with the cut
answer and the steering message."""

from __future__ import annotations

import threading
from typing import Any

from responses_cache import create_app, get_renderer
from responses_cache.backends import load_backend
from responses_cache.testing import Behaviour, FakeCerebras, steer_mid_answer, wait_for

ENC = get_renderer("harmony").encoding
LONG = "<|channel|>final<|message|>" + "word " * 1500 + "<|return|>"
SHORT = "<|channel|>final<|message|>Brief.<|return|>"


def test_a_steer_ends_the_completion_and_the_successor_extends_its_prompt(responses_cache_server_factory: Any) -> None:
    engine = FakeCerebras(ENC, [LONG, SHORT])
    # After a few tokens the target's stream gives one token per release of the gate: one after
    # the steer is accepted (the steer always lands mid-answer), then none. A stream nobody
    # closes stays open, stalled; a steer that stops nothing leaves the target unfinished.
    gate = threading.Semaphore(0)
    engine.behaviours = [Behaviour(chunk_tokens=1, hang_after=8, gate=gate)]
    engine.default = Behaviour(chunk_tokens=1)
    url = f"http://127.0.0.1:{responses_cache_server_factory(engine.app()).port}"
    backend = load_backend("cerebras", model="gpt-oss-120b", base_url=url, api_key="csk-test", served_models=["gpt-oss"],
                           warm_tcp_connection=False, max_retries=0)
    server = responses_cache_server_factory(create_app(backend=backend, renderer="harmony"))
    first, second = steer_mid_answer(server.ws_url, gate, model="gpt-oss", input="Write at length.", steer="Stop; be brief.")
    assert second["previous_response_id"] == first["id"] and second["status"] == "completed"
    assert first["status"] == "incomplete" and first["incomplete_details"] == {"reason": "steered"}
    # The engine's stream for the target was closed before its end; only the successor's finished.
    wait_for(lambda: engine.closed_early == 1, "the steered completion's stream was never closed")
    assert engine.completed == 1
    one, two = (r.body["prompt"] for r in engine.generation_requests())
    assert two[: len(one)] == one  # appended, not re-rendered
    tail = ENC.decode(two[len(one):])
    assert "Stop; be brief." in tail
    text = first["output"][0]["content"][0]["text"]
    assert 1 <= text.count("word") < 1500 and "<|message|>" + text + "<|end|>" in tail
