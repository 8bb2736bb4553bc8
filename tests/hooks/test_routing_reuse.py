"""Routing reuse over a WebSocket connection: the router resolves once per connection (and again
only after its version changes); a lane's replica affinity is stable."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.asyncio.client import connect

from responses_cache import SimulatedConfig, SimulatedEngine
from responses_cache.backends.routing import Route, StaticRouter
from responses_cache.testing import RecordingBackend


async def _turn(ws: Any, **body: Any) -> dict[str, Any]:
    await ws.send(json.dumps({"type": "response.create", "model": "sim-1", **body}))
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert event["type"] != "error", event
        if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
            response: dict[str, Any] = event["response"]
            return response


def _route(backend: Any, replicas: int = 1) -> Route:
    return Route(name="r", model="sim-1", backend=backend, renderer=None, replicas=replicas)


async def test_resolve_once_per_connection_and_again_after_set_route(
    responses_cache_server_factory: Any,
) -> None:
    first, second = RecordingBackend(), RecordingBackend()
    router = StaticRouter({"sim-1": _route(first, replicas=8)})
    server = responses_cache_server_factory(
        router=router, backend=SimulatedEngine(SimulatedConfig(instant=True)), renderer=None
    )
    async with connect(server.ws_url) as ws:
        previous = None
        for i in range(6):
            response = await _turn(ws, input=f"turn {i}", previous_response_id=previous)
            previous = response["id"]
        assert router.resolutions == 1
        assert len(first.requests) == 6
        # Affinity: every turn of the (default) lane went to the same replica.
        assert len({r.affinity_key for r in first.requests}) == 1
        router.set_route("sim-1", _route(second, replicas=8))
        for i in range(3):
            response = await _turn(ws, input=f"after {i}", previous_response_id=previous)
            previous = response["id"]
        assert router.resolutions == 2
        assert len(first.requests) == 6 and len(second.requests) == 3
    # A second connection resolves for itself.
    async with connect(server.ws_url) as ws:
        await _turn(ws, input="new connection")
        await _turn(ws, input="again")
    assert router.resolutions == 3


def test_replica_for_is_stable_per_lane() -> None:
    route = _route(None, replicas=8)
    twin = _route(None, replicas=8)
    keys = [f"tenant/lane-{i}" for i in range(200)]
    picks = [route.replica_for(k) for k in keys]
    assert picks == [route.replica_for(k) for k in keys] == [twin.replica_for(k) for k in keys]
    assert set(picks) == set(range(8))  # lanes spread over every replica
    assert all(_route(None).replica_for(k) == 0 for k in keys)
