"""Trace context reaches vLLM: each engine request of a traced WebSocket tool loop carries a
``traceparent`` naming the turn's ``engine`` stage (so vLLM's own spans join the client's
trace), and the turn span reports the prefix-cache hits the engine measured."""

from __future__ import annotations

import json
import time
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from websockets.sync.client import connect

from responses_cache import create_app, get_renderer
from responses_cache.backends import load_backend
from responses_cache.observability.otel import OpenTelemetryTracer
from responses_cache.testing import FakeVllm

TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
CALL = (
    "<|channel|>commentary to=functions.exec_command <|constrain|>json<|message|>"
    '{"cmd": "ls"}<|call|>'
)
ANSWER = "<|channel|>final<|message|>There are two files.<|return|>"
ENC = get_renderer("harmony").encoding
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


def _turn(ws: Any, **body: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", "model": "gpt-oss", "tools": TOOLS, "store": False, **body}))
    while (event := json.loads(ws.recv()))["type"] not in ("response.completed", "response.failed", "error"):
        pass
    return dict(event)


def test_traceparent_reaches_the_engine_under_the_engine_stage(responses_cache_server_factory: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = FakeVllm(ENC, [CALL, ANSWER])
    url = f"http://127.0.0.1:{responses_cache_server_factory(engine.app()).port}"
    backend = load_backend("vllm", base_urls=[url], model="openai/gpt-oss-20b", served_models=["gpt-oss"], template="harmony")
    server = responses_cache_server_factory(create_app(backend=backend, tracer=OpenTelemetryTracer(provider)))
    with connect(server.ws_url, additional_headers={"traceparent": TRACEPARENT}) as ws:
        first = _turn(ws, input="What is in this directory? " * 20)
        call = first["response"]["output"][-1]
        second = _turn(ws, previous_response_id=first["response"]["id"],
                       input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt\nb.txt"}])
    assert second["type"] == "response.completed"
    deadline = time.monotonic() + 10
    while len([s for s in exporter.get_finished_spans() if s.name == "responses.turn"]) < 2:
        assert time.monotonic() < deadline, "the turn spans did not end"
        time.sleep(0.005)
    spans = exporter.get_finished_spans()
    engine_spans = sorted((s for s in spans if s.name == "engine"), key=lambda s: s.start_time or 0)
    received = [r.headers for r in engine.generation_requests()]
    assert len(received) == len(engine_spans) == 2
    for headers, span in zip(received, engine_spans, strict=True):
        _, trace_id, parent, _ = headers["traceparent"].split("-")
        assert trace_id == TRACE_ID and int(parent, 16) == span.context.span_id  # type: ignore[union-attr]
    turn = max((s for s in spans if s.name == "responses.turn"), key=lambda s: s.start_time or 0)
    cached = second["response"]["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached > 0 and (turn.attributes or {})["responses_cache.tokens.engine_cached"] > 0
