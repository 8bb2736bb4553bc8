"""Steering through the Cerebras adapter (token path): the steered completion stream is dropped
and the successor is one more completion whose prompt extends the target's prompt with the cut
answer and the steering message."""

from __future__ import annotations

import json
from typing import Any

from websockets.sync.client import connect

from responses_cache import create_app, get_renderer
from responses_cache.backends import load_backend
from responses_cache.testing import Behaviour, FakeCerebras

ENC = get_renderer("harmony").encoding
LONG = "<|channel|>final<|message|>" + "word " * 1500 + "<|return|>"
SHORT = "<|channel|>final<|message|>Brief.<|return|>"


def test_a_steer_ends_the_completion_and_the_successor_extends_its_prompt(responses_cache_server_factory: Any) -> None:
    engine = FakeCerebras(ENC, [LONG, SHORT])
    engine.default = Behaviour(chunk_tokens=1)
    url = f"http://127.0.0.1:{responses_cache_server_factory(engine.app()).port}"
    backend = load_backend("cerebras", model="gpt-oss-120b", base_url=url, api_key="csk-test", served_models=["gpt-oss"],
                           warm_tcp_connection=False, max_retries=0)
    server = responses_cache_server_factory(create_app(backend=backend, renderer="harmony"))
    with connect(server.ws_url, max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-oss", "input": "Write at length."}))
        while (event := json.loads(ws.recv()))["type"] != "response.created":
            pass
        target = event["response"]["id"]
        while json.loads(ws.recv())["type"] != "response.output_text.delta":
            pass
        ws.send(json.dumps({"type": "response.steer", "previous_response_id": target, "input": "Stop; be brief."}))
        ends: list[dict[str, Any]] = []
        while len(ends) < 2:
            event = json.loads(ws.recv())
            if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                ends.append(event["response"])
    first, second = ends
    assert first["id"] == target and second["previous_response_id"] == target and second["status"] == "completed"
    one, two = (r.body["prompt"] for r in engine.generation_requests())
    assert two[: len(one)] == one  # appended, not re-rendered
    tail = ENC.decode(two[len(one):])
    assert "Stop; be brief." in tail
    if first["status"] == "incomplete":  # the usual case: the steer landed mid-answer
        assert first["incomplete_details"] == {"reason": "steered"}
        text = first["output"][0]["content"][0]["text"]
        assert text.count("word") < 1500 and "<|message|>" + text + "<|end|>" in tail
