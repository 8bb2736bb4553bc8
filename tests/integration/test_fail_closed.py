"""Fail closed at every mount: the bridge admits an upgrade only on a 2xx from the wrapped app,
a mounted service needs an explicit authenticator, an authenticator that raises
admits no one, and tenants do not share the engine's prefix cache unless told to."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from responses_cache import (
    AllowAll,
    BearerKeys,
    SimulatedConfig,
    SimulatedEngine,
    WebSocketMode,
    create_app,
    create_service,
)


def _probe_app(answer: str) -> Starlette:
    """A wrapped app whose ``GET /v1/models`` answers ``answer``: a status code, or ``raise``."""

    async def models(request: Request) -> Response:
        if answer == "raise":
            raise RuntimeError("no database configured")
        if answer == "missing-key" and "authorization" not in request.headers:
            raise KeyError("authorization")
        status = 200 if answer == "missing-key" else int(answer)
        return JSONResponse({"error": {"message": "nope"}} if status >= 300 else {"data": []}, status)

    return Starlette(routes=[Route("/v1/models", models)])


@pytest.mark.parametrize("answer", ["400", "404", "500", "302", "raise", "missing-key"])
def test_the_bridge_refuses_every_answer_but_2xx(responses_cache_server_factory: Any, answer: str) -> None:
    server = responses_cache_server_factory(WebSocketMode(_probe_app(answer)))
    headers = {} if answer == "missing-key" else {"Authorization": "Bearer wrong"}
    with pytest.raises(InvalidStatus) as err:
        connect(server.ws_url, additional_headers=headers, open_timeout=10)
    assert err.value.response.status_code == 401
    assert json.loads(err.value.response.body or b"{}")["error"]["code"] == "invalid_api_key"


def test_the_bridge_admits_on_2xx(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(WebSocketMode(_probe_app("200")))
    with connect(server.ws_url, additional_headers={"Authorization": "Bearer right"}, open_timeout=10) as ws:
        ws.send('{"type":"nope"}')
        assert json.loads(ws.recv(timeout=10))["type"] == "error"  # admitted, and served


def test_websocket_mode_with_a_service_needs_an_explicit_authenticator() -> None:
    """A mounted service always carries an authenticator: ``create_service`` refuses to build one
    that would let everyone in unless told so (``AllowAll()``)."""
    app = Starlette()
    with pytest.raises(ValueError, match="authenticator"):
        create_service(backend=SimulatedEngine())
    service = create_service(backend=SimulatedEngine(), authenticator=AllowAll())  # said out loud
    assert WebSocketMode(app, service).service.authenticator is service.authenticator


class Broken:
    async def authenticate(self, headers: Mapping[str, str]) -> str | None:
        raise ConnectionError("the key store is down")


def test_an_authenticator_that_raises_admits_no_one(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(authenticator=Broken())
    with pytest.raises(InvalidStatus) as err:
        connect(server.ws_url, open_timeout=10)
    assert err.value.response.status_code == 401
    r = httpx.post(f"{server.http_url}/responses", json={"model": "sim-1", "input": "hi"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("partition", [True, False])
async def test_tenants_do_not_share_the_engine_prefix_cache(partition: bool) -> None:
    engine = SimulatedEngine(SimulatedConfig(prefill_tokens_per_s=1e12, output_tokens_per_s=1e12, answer_tokens=2))
    app = create_app(backend=engine, api_keys={"sk-a": "alice", "sk-b": "bob"}, partition_prefix_cache=partition)
    prompt = {"model": "sim-1", "input": "a long shared document " * 400, "store": False}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as client:
        first = await client.post("/responses", json=prompt, headers={"Authorization": "Bearer sk-a"})
        assert first.status_code == 200
        prompt_tokens = first.json()["usage"]["input_tokens"]
        before = engine.prefilled_tokens
        second = await client.post("/responses", json=prompt, headers={"Authorization": "Bearer sk-b"})
        assert second.status_code == 200
        bob_prefilled = engine.prefilled_tokens - before
        before = engine.prefilled_tokens
        third = await client.post("/responses", json=prompt, headers={"Authorization": "Bearer sk-a"})
        assert third.status_code == 200
        alice_again = engine.prefilled_tokens - before
    assert alice_again < 128 + 10  # a tenant still reuses its own prefix
    if partition:
        assert bob_prefilled == prompt_tokens  # nothing of alice's prompt was reused for bob
    else:
        assert bob_prefilled < 128 + 10  # opt-out: one shared cache


def test_bearer_keys_tenants_reach_the_backend(responses_cache_server_factory: Any) -> None:
    from responses_cache.testing import RecordingBackend

    backend = RecordingBackend()
    server = responses_cache_server_factory(backend=backend, authenticator=BearerKeys({"sk-a": "alice"}))
    r = httpx.post(f"{server.http_url}/responses", json={"model": "sim-1", "input": "hi"}, headers={"Authorization": "Bearer sk-a"})
    assert r.status_code == 200
    (request,) = backend.requests
    assert request.tenant == "alice" and request.cache_salt and "alice" not in request.cache_salt
