"""Metrics through Prometheus and OpenTelemetry under the same names, and JSON log lines per
turn and per error carrying the turn's response and trace ids."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from responses_cache import (
    Biller,
    JsonlSink,
    MetricsTee,
    PrometheusMetrics,
    SimulatedConfig,
    SimulatedEngine,
    create_app,
)
from responses_cache.observability.logs import use_json_logs
from responses_cache.observability.otel import OpenTelemetryMetrics, OpenTelemetryTracer

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _turns(client: TestClient, count: int, **headers: str) -> list[dict[str, Any]]:
    """``count`` chained WebSocket turns on one connection; their completed responses."""
    done: list[dict[str, Any]] = []
    with client.websocket_connect("/v1/responses", headers=headers) as ws:
        previous = None
        for k in range(count):
            ws.send_json({"type": "response.create", "model": "sim-1", "input": f"turn {k}", "previous_response_id": previous})
            while (event := ws.receive_json())["type"] not in ("response.completed", "response.failed", "error"):
                pass
            done.append(event)
            previous = event.get("response", {}).get("id")
    return done


def _prometheus_families(text: str) -> set[str]:
    """Metric family names, counters without ``_total`` (an OpenTelemetry Prometheus exporter
    adds it to a counter's name, as ``prometheus_client`` does)."""
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    return {n.removesuffix("_total") for n in names if not n.endswith("_created")}


def test_prometheus_and_opentelemetry_get_the_same_names(tmp_path: Path) -> None:
    prometheus = PrometheusMetrics()
    reader = InMemoryMetricReader()
    otel = OpenTelemetryMetrics(MeterProvider(metric_readers=[reader]))
    biller = Biller(JsonlSink(tmp_path / "usage.jsonl"), flush_interval=0)
    app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True)), metrics=MetricsTee(prometheus, otel), billing=biller)
    with TestClient(app) as client:
        _turns(client, 2)
    # After shutdown the biller has delivered both records (and observed their lag).
    text = prometheus.exposition().decode()
    data = reader.get_metrics_data()
    assert data is not None
    otel_names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    for name in ("time_to_first_token_seconds", "turn_overhead_seconds", "rendered_tokens", "parent_tier",
                 "stage_seconds", "responses_completed", "billing_lag_seconds"):
        assert f"responses_cache_{name}" in otel_names, name
    assert otel_names == _prometheus_families(text)
    # Histograms where a dashboard wants quantiles; the parent tier of each turn.
    assert "responses_cache_time_to_first_token_seconds_bucket{" in text
    assert 'responses_cache_parent_tier_total{tier="none",transport="websocket"} 1.0' in text
    assert 'responses_cache_parent_tier_total{tier="connection",transport="websocket"} 1.0' in text


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = use_json_logs(stream=stream)
    logger = logging.getLogger("responses_cache")
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_line_per_turn_with_its_trace_and_response_ids(json_log: io.StringIO) -> None:
    app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True)))
    with TestClient(app) as client:
        first, second = _turns(client, 2, traceparent=TRACEPARENT)
    lines = [line for line in _lines(json_log) if line["logger"] == "responses_cache.turns"]
    assert [line["response_id"] for line in lines] == [first["response"]["id"], second["response"]["id"]]
    # Without a tracer, the trace id is the client's.
    assert {line["trace_id"] for line in lines} == {"4bf92f3577b34da6a3ce929d0e0e4736"}
    assert [line["parent_tier"] for line in lines] == ["none", "connection"]
    assert lines[1]["reused_tokens"] > 0 and lines[1]["rendered_tokens"] > 0
    assert all(line["status"] == "completed" and line["level"] == "info" and "ttft_ms" in line for line in lines)
    assert lines[1]["input_tokens"] == second["response"]["usage"]["input_tokens"]


class _Exploding:
    """A blocking hook with a bug: the turn fails, and the error is logged."""

    name = "exploding"
    phase = "before"

    async def __call__(self, ctx: Any, new_items: Any, state: Any) -> Any:
        logging.getLogger("responses_cache.hooks").error("the hook is about to fail")
        raise RuntimeError("hook bug")


def test_an_error_line_carries_the_turns_ids(json_log: io.StringIO) -> None:
    tracer = OpenTelemetryTracer(TracerProvider())
    app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True)), hooks=[_Exploding()], tracer=tracer)
    with TestClient(app) as client:
        reply = client.post("/v1/responses", json={"model": "sim-1", "input": "hi"}, headers={"traceparent": TRACEPARENT})
    assert reply.status_code == 500
    lines = _lines(json_log)
    hook = next(line for line in lines if line["message"] == "the hook is about to fail")
    turn = next(line for line in lines if line["logger"] == "responses_cache.turns")
    assert turn["status"] == "error" and turn["level"] == "warning" and "hook bug" in turn["error"]
    # The traced turn's trace (the client's) and response id, on both lines.
    assert hook["trace_id"] == turn["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert hook["response_id"] == turn["response_id"] and turn["response_id"].startswith("resp_")


def test_an_error_line_without_a_client_trace_carries_the_turn_spans_trace_id(json_log: io.StringIO) -> None:
    """A client that sent no ``traceparent``: the turn's span starts a trace, and a line logged
    while the turn runs (a hook failing) and the turn's line carry the id the exported span has."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(
        backend=SimulatedEngine(SimulatedConfig(instant=True)), hooks=[_Exploding()], tracer=OpenTelemetryTracer(provider)
    )
    with TestClient(app) as client:
        reply = client.post("/v1/responses", json={"model": "sim-1", "input": "hi"})  # no traceparent
    assert reply.status_code == 500
    lines = _lines(json_log)
    hook = next(line for line in lines if line["message"] == "the hook is about to fail")
    turn = next(line for line in lines if line["logger"] == "responses_cache.turns")
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "responses.turn"]
    assert span.context is not None
    assert hook["trace_id"] == turn["trace_id"] == f"{span.context.trace_id:032x}"


def test_a_text_line_per_turn_says_what_the_turn_did() -> None:
    """``serve --log-level info`` and vLLM's log print the message alone: it carries the turn's
    figures (a JSON line has them as fields)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("responses_cache.turns")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True)))
        with TestClient(app) as client:
            _, second = _turns(client, 2)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    line = stream.getvalue().splitlines()[1]
    pattern = (
        rf"turn {second['response']['id']} completed in [0-9.]+ ms "
        rf"\(first token [0-9.]+ ms; [0-9,]+ tokens rendered, ([0-9,]+) reused; {second['response']['usage']['output_tokens']} out\)"
    )
    found = re.fullmatch(pattern, line)
    assert found is not None and int(found.group(1).replace(",", "")) > 0, line  # the second turn reused the first's
