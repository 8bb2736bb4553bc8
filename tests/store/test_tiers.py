"""State tiers, counted in rendering work: a continuation on the process that holds the state
appends (HTTP as flat as WebSocket), another process appends from the store's snapshot, and a
snapshot the renderer cannot vouch for falls back to a full render."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from responses_cache import create_app
from responses_cache.backends.simulated import SimulatedConfig, SimulatedEngine
from responses_cache.conversation import EMPTY
from responses_cache.protocol.items import Message
from responses_cache.protocol.response import Response
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.storage.hot import HotCache, state_bytes
from responses_cache.storage.redis_store import RedisResponseStore
from responses_cache.storage.state import ResponseState
from tests.asgi_turns import MODEL, conversation, post, renderer_of


def _app(**options: Any) -> Any:
    options.setdefault("backend", SimulatedEngine(SimulatedConfig(instant=True)))
    return create_app(**options)


async def _rendered_by(app: Any, previous: str) -> tuple[int, dict[str, Any]]:
    """Items the renderer tokenized for one more HTTP turn, and the response."""
    stats = renderer_of(app).stats
    before = stats.items_rendered + stats.items_sampled
    response = await post(app, "/v1/responses", {"input": "one more", "previous_response_id": previous})
    return stats.items_rendered + stats.items_sampled - before, response


async def test_http_continuation_on_the_holding_process_appends() -> None:
    app = _app()
    previous = await conversation(app, 8)
    work, response = await _rendered_by(app, previous)
    # The new user message and the output: nothing of the 8 earlier turns is rendered again.
    assert work == 1 + len(response["output"])
    assert app.state.service.core.hot_hits == 8 and app.state.service.core.hydrations == 0


async def test_without_the_hot_cache_http_renders_the_whole_chain() -> None:
    app = _app(hot_cache_bytes=0)
    previous = await conversation(app, 8)
    work, _ = await _rendered_by(app, previous)
    assert work > 8 * 2  # every earlier item again
    assert app.state.service.core.hydrations == 8


@pytest.mark.parametrize("other_renderer", ["harmony", "chatml"])
async def test_another_process_appends_from_the_snapshot_or_renders_in_full(redis_url: str, other_renderer: str) -> None:
    a = _app(store=RedisResponseStore(redis_url), own_store=True)
    b = _app(store=RedisResponseStore(redis_url), own_store=True, renderer=other_renderer)
    async with a.router.lifespan_context(a), b.router.lifespan_context(b):
        previous = await conversation(a, 6)
        work, response = await _rendered_by(b, previous)
        service = b.state.service.core
        assert service.hydrations == 1 and response["status"] == "completed"
        if other_renderer == "harmony":  # the same fingerprint: the snapshot's log is extended
            assert service.snapshot_restores == 1
            assert work == 1 + len(response["output"])
        else:  # another template: the snapshot is refused, the conversation rendered in full
            assert service.snapshot_restores == 0
            assert work > 6 * 2
        # and back on A, which never saw B's turn: the snapshot again (A has no hot entry for it)
        work, back = await _rendered_by(a, response["id"])
        assert a.state.service.core.hot_hits == 5 and a.state.service.core.hydrations == 1
        if other_renderer == "harmony":
            assert a.state.service.core.snapshot_restores == 1 and work == 1 + len(back["output"])


async def test_a_response_deleted_elsewhere_is_not_continued_from_the_hot_cache(redis_url: str) -> None:
    a = _app(store=RedisResponseStore(redis_url), own_store=True)
    b = _app(store=RedisResponseStore(redis_url), own_store=True)
    async with a.router.lifespan_context(a), b.router.lifespan_context(b):
        previous = await conversation(a, 2)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=b), base_url="http://t") as client:
            assert (await client.delete(f"/v1/responses/{previous}")).status_code == 200
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://t") as client:
            reply = await client.post("/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": previous})
        assert reply.status_code == 400
        assert reply.json()["error"]["code"] == "previous_response_not_found"


def _state(tenant: str, rid: str, *, store: bool = True, text: str = "x") -> ResponseState:
    item = Message(role="user", content=text)
    response = Response(
        id=rid, created_at=0, status="completed", model=MODEL, output=[], tools=[], tool_choice="auto",
        parallel_tool_calls=True, store=store,
    )
    return ResponseState(
        response=response, tenant=tenant, lane=None, conversation=EMPTY.extend([item]), instructions=None,
        tools=EMPTY_TOOLS, fingerprint=None, token_log=None, route=None,
        total_bytes=len(msgspec.json.encode(item)),
    )


def test_hot_cache_is_tenant_scoped_bounded_and_expires() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    one = state_bytes(_state("t", "r0"))
    hot = HotCache(one * 3, ttl_s=10, timer=clock)
    hot.put(_state("alice", "r1"))
    assert hot.get("bob", "r1") is None and hot.get("alice", "r1") is not None
    hot.put(_state("alice", "nostore", store=False))
    assert hot.get("alice", "nostore") is None  # never makes a store:false response reachable
    for k in range(2, 6):
        hot.put(_state("alice", f"r{k}"))
    assert len(hot) == 3 and hot.total_bytes <= one * 3  # least recently used gave way
    assert hot.get("alice", "r5") is not None
    hot.put(_state("alice", "huge", text="y" * 10 * one))
    assert hot.get("alice", "huge") is None and len(hot) == 3  # larger than the budget: skipped
    now[0] = 11
    assert hot.get("alice", "r5") is None  # no longer than the store keeps it


def test_a_reconnect_to_the_same_process_is_hot(responses_cache_server_factory: Any) -> None:
    """A ``store: true`` WebSocket conversation, continued on a new connection to the same
    process, and over HTTP there: both find the state hot and append."""
    import json

    from websockets.sync.client import connect

    server = responses_cache_server_factory(backend=SimulatedEngine(SimulatedConfig(instant=True)))
    app = server.app
    stats = renderer_of(app).stats

    def turn(ws: Any, text: str, previous: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"type": "response.create", "model": MODEL, "input": text, "store": True}
        if previous:
            body["previous_response_id"] = previous
        ws.send(json.dumps(body))
        for _ in range(10_000):
            event = json.loads(ws.recv(timeout=30))
            if event["type"] in ("response.completed", "error"):
                assert event["type"] == "response.completed", event
                response: dict[str, Any] = event["response"]
                return response
        raise AssertionError("no terminal event")

    with connect(server.ws_url) as ws:
        previous = None
        for k in range(6):
            previous = turn(ws, f"turn {k}: " + "words " * 40, previous)["id"]
    before = stats.items_rendered + stats.items_sampled
    with connect(server.ws_url) as ws:
        response = turn(ws, "after a reconnect", previous)
    assert stats.items_rendered + stats.items_sampled - before == 1 + len(response["output"])
    assert app.state.service.core.hot_hits == 1 and app.state.service.core.hydrations == 0
    reply = httpx.post(f"{server.http_url}/responses", json={"model": MODEL, "input": "and over HTTP", "previous_response_id": response["id"]}, timeout=30)
    assert reply.status_code == 200
    assert app.state.service.core.hot_hits == 2 and app.state.service.core.hydrations == 0
