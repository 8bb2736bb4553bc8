"""``store: true`` over HTTP with the in-memory store's byte bounds: recent responses are
retrieved and continued; one the store evicted gets the errors of a response that never existed
(404 ``response_not_found``, 400 ``previous_response_not_found``), with the hot cache or without;
one tenant's responses never push another's out."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from responses_cache import create_app
from responses_cache.backends.simulated import SimulatedConfig, SimulatedEngine
from responses_cache.observability.metrics import InMemoryMetrics

KEYS = {"sk-a": "a", "sk-b": "b"}
TEXT = "all work and no play " * 1000  # about 21 kB a response


def _app(metrics: InMemoryMetrics, **options: Any) -> Any:
    return create_app(
        backend=SimulatedEngine(SimulatedConfig(instant=True)), api_keys=KEYS, metrics=metrics,
        store_max_bytes=400_000, store_max_tenant_bytes=100_000, **options,
    )


async def _call(app: Any, key: str, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.request(method, path, json=body, headers={"Authorization": f"Bearer {key}"})


async def _create(app: Any, key: str, text: str, previous: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"model": "sim-1", "input": text}
    if previous is not None:
        body["previous_response_id"] = previous
    return await _call(app, key, "POST", "/v1/responses", body)


def _error(reply: httpx.Response, status: int, code: str) -> None:
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["code"] == code


@pytest.mark.parametrize("hot_cache_bytes", [None, 0], ids=["hot", "store only"])
async def test_recent_responses_continue_and_an_evicted_one_is_not_found(hot_cache_bytes: int | None) -> None:
    metrics = InMemoryMetrics()
    app = _app(metrics, hot_cache_bytes=hot_cache_bytes)
    other = (await _create(app, "sk-b", TEXT)).json()["id"]
    ids = []
    for k in range(12):  # tenant a stores about 2.5 times its bound
        reply = await _create(app, "sk-a", f"{k} {TEXT}")
        assert reply.status_code == 200, reply.text
        ids.append(reply.json()["id"])
    store = app.state.service.core.store
    assert store.tenant_bytes("a") <= 100_000 and store.total_bytes <= 400_000
    assert metrics.total("store_evictions_total", bound="tenant_bytes") >= 7
    hot = app.state.service.core.hot
    if hot is not None:  # an evicted response's state left the hot cache with it
        assert hot.get("a", ids[0]) is None and hot.get("a", ids[-1]) is not None
    # the newest continue, and the other tenant's response is still there
    for previous, key in ((ids[-1], "sk-a"), (ids[-2], "sk-a"), (other, "sk-b")):
        assert (await _call(app, key, "GET", f"/v1/responses/{previous}")).status_code == 200
        reply = await _create(app, key, "go on", previous)
        assert reply.status_code == 200 and reply.json()["previous_response_id"] == previous
    # the oldest is gone, as if it had never been stored
    _error(await _call(app, "sk-a", "GET", f"/v1/responses/{ids[0]}"), 404, "response_not_found")
    _error(await _create(app, "sk-a", "go on", ids[0]), 400, "previous_response_not_found")


async def test_a_chain_whose_first_response_was_evicted_is_not_found_from_the_store() -> None:
    """Hydrating needs every link of the chain (as with the response count bound): without the
    hot cache, a continuation of a chain whose oldest link was evicted is not found."""
    metrics = InMemoryMetrics()
    app = _app(metrics, hot_cache_bytes=0)
    previous = None
    for k in range(8):  # the chain outgrows the tenant's bound (about 4 responses) at once
        reply = await _create(app, "sk-a", f"{k} {TEXT}", previous)
        if reply.status_code != 200:
            break
        previous = reply.json()["id"]
    assert previous is not None and k >= 4
    _error(reply, 400, "previous_response_not_found")
    assert (await _call(app, "sk-a", "GET", f"/v1/responses/{previous}")).status_code == 200  # it is stored
