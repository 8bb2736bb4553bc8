"""Metrics: in-memory totals, and Prometheus exposition at /metrics."""

from __future__ import annotations

from starlette.testclient import TestClient

from responses_cache import (
    InMemoryMetrics,
    PrometheusMetrics,
    SimulatedConfig,
    SimulatedEngine,
    create_app,
)


def test_in_memory_totals_sum_over_label_sets() -> None:
    m = InMemoryMetrics()
    m.inc("hits_total", {"transport": "websocket"})
    m.inc("hits_total", {"transport": "http"}, 2)
    m.observe("stage_seconds", 0.5, {"stage": "render"})
    assert m.total("hits_total") == 3 and m.total("hits_total", transport="http") == 2


def test_prometheus_exposition_after_a_websocket_turn() -> None:
    metrics = PrometheusMetrics()
    app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True)), metrics=metrics)
    with TestClient(app) as client:
        with client.websocket_connect("/v1/responses") as ws:
            ws.send_json({"type": "response.create", "model": "sim-1", "input": "hi"})
            while ws.receive_json()["type"] != "response.completed":
                pass
        text = client.get("/metrics").text
    assert 'responses_cache_responses_completed_total{transport="websocket"} 1.0' in text
    assert "responses_cache_stage_seconds_count" in text
    assert "responses_cache_queue_wait_seconds_count" in text
