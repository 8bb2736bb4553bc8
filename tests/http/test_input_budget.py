"""HTTP bodies share the process-wide input budget with WebSocket frames: charged while their
turn runs, released when it ends (whatever the outcome), refused with 429 beyond it."""

from __future__ import annotations

from typing import Any

import httpx

from responses_cache import SimulatedConfig, SimulatedEngine, create_app
from responses_cache.edge.websocket import WebSocketMode
from responses_cache.session.session import InputBudget


def _budget(app: Any) -> InputBudget:
    node = app.build_middleware_stack()
    while not isinstance(node, WebSocketMode):
        node = node.app
    assert node.input_budget is not None
    return node.input_budget


async def test_http_bodies_are_charged_and_released() -> None:
    app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=2)), process_input_bytes=50_000)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t/v1") as client:
        ok = await client.post("/responses", json={"model": "sim-1", "input": "x" * 10_000})
        assert ok.status_code == 200
        streamed = await client.post("/responses", json={"model": "sim-1", "input": "x" * 10_000, "stream": True})
        assert streamed.status_code == 200 and "response.completed" in streamed.text
        refused = await client.post("/responses", json={"model": "sim-1", "input": "x" * 60_000})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
        bad = await client.post("/responses", json={"model": "sim-1", "input": [1]})
        assert bad.status_code == 400
    budget = _budget(app)
    assert budget.held == 0 and 10_000 < budget.peak <= 50_000 and budget.refusals == 1
