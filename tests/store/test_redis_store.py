"""``RedisResponseStore`` against a real server and a real 3-node Redis Cluster (each test runs on
both: ``redis_url``): encoding, one command per chain, tenant-scoped keys, expiry along the
chain, size limits, and failures as the OpenAI error envelope."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import msgspec
import pytest
import redis.asyncio.connection

from benchmarks.suite.redisproc import node_clients
from responses_cache import create_app
from responses_cache.protocol.ids import new_id, new_response_id
from responses_cache.protocol.items import FunctionCall, Message
from responses_cache.protocol.response import Response, Usage
from responses_cache.storage.redis_client import redis_client
from responses_cache.storage.redis_store import RedisResponseStore, StoreUnavailable
from responses_cache.storage.store import StoredResponse
from responses_cache.tokens.snapshot import LogDelta, Segment

TOOLS = b'[{"type":"function","name":"f","parameters":{"type":"object"}}]'


#: A chain tag per conversation of these tests (``r…`` and ``s…``): their ids are shaped as the
#: service makes them, so on the cluster each conversation has its own slot.
TAGS = {"r": "5eed0001", "s": "5eed0002"}


def rid(name: str) -> str:
    """The response id of ``r1``, ``s3``…: ``resp_`` + the conversation's tag + the number."""
    return f"resp_{TAGS[name[0]]}{int(name[1:]):040x}"


def _stored(tenant: str, rid: str, parent: str | None, text: str = "hi", snapshot: LogDelta | None = None) -> StoredResponse:
    response = Response(
        id=rid, created_at=1, status="completed", model="sim-1",
        output=[Message(role="assistant", content=text), FunctionCall(call_id="c1", name="f", arguments="{}")],
        tools=msgspec.Raw(TOOLS), tool_choice="auto", parallel_tool_calls=True, previous_response_id=parent,
        usage=Usage.of(10, 2, 3), metadata={"k": "v"},
    )
    return StoredResponse(tenant, response, (Message(role="user", content=text),), "be brief", TOOLS, snapshot)


@pytest.fixture(params=["single", "cluster", "sentinel"])
def redis_url(request: pytest.FixtureRequest, redis_deployment: Callable[[str], str]) -> str:
    """The store's own tests run on one server, the 3-node cluster, and through a Sentinel."""
    return redis_deployment(request.param)


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisResponseStore]:
    s = RedisResponseStore(redis_url)
    yield s
    await s.aclose()


@pytest.fixture
def requests_sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``[n]``: the requests this process's asyncio Redis connections have written so far (one per
    round trip; a pipeline counts once), whatever the client (a server's, a cluster node's)."""
    sent = [0]
    write = redis.asyncio.connection.AbstractConnection.send_packed_command

    async def counted(self: Any, command: Any, check_health: bool = True) -> None:
        sent[0] += 1
        await write(self, command, check_health)

    monkeypatch.setattr(redis.asyncio.connection.AbstractConnection, "send_packed_command", counted)
    return sent


async def test_round_trip_and_one_command_per_chain(redis_url: str, requests_sent: list[int]) -> None:
    store = RedisResponseStore(client=redis_client(redis_url))
    snap = LogDelta(b"fp", 0, (Segment(b"\x01\x00\x00\x00", 2, (-1, -1, False), "c1", "functions.f"),), b"\x02\x00\x00\x00")
    await store.put(_stored("alice", rid("r1"), None, "one", snap))
    for k in range(2, 51):
        await store.put(_stored("alice", rid(f"r{k}"), rid(f"r{k - 1}"), f"turn {k}"))
    got = await store.get("alice", rid("r1"))
    assert got is not None
    assert msgspec.json.encode(got.response) == msgspec.json.encode(_stored("alice", rid("r1"), None, "one").response)
    assert got.input_items == (Message(role="user", content="one"),)
    assert got.instructions == "be brief" and got.tools_json == TOOLS and got.snapshot == snap
    await store.get_chain("alice", rid("r50"))  # loads the script once
    before = requests_sent[0]
    chain = await store.get_chain("alice", rid("r50"))
    assert requests_sent[0] - before == 1  # 50 links, one request
    before = requests_sent[0]
    await store.put(_stored("alice", rid("r51"), rid("r50")))  # the write refreshes the chain's expiry too
    assert requests_sent[0] - before == 1
    await store.aclose()  # a client handed in stays open: its owner closes it
    assert await store._client.ping()
    await store._client.aclose()
    assert chain is not None and [s.id for s in chain] == [rid(f"r{k}") for k in range(1, 51)]
    assert [s.input_items[0].content for s in chain[1:]] == [f"turn {k}" for k in range(2, 51)]  # type: ignore[union-attr]


async def test_tenants_are_isolated(store: RedisResponseStore) -> None:
    await store.put(_stored("alice", rid("r1"), None))
    assert await store.get("bob", rid("r1")) is None
    assert await store.get_chain("bob", rid("r1")) is None
    assert not await store.contains("bob", rid("r1"))
    assert not await store.delete("bob", rid("r1"))
    assert await store.contains("alice", rid("r1"))
    # A tenant name that looks like another's key prefix cannot reach it either.
    await store.put(_stored("a", "x:r1", None))
    assert await store.get("a:x", "r1") is None


async def test_a_missing_link_or_a_long_chain_is_not_found(store: RedisResponseStore, redis_url: str) -> None:
    for k in range(1, 6):
        await store.put(_stored("t", rid(f"r{k}"), rid(f"r{k - 1}") if k > 1 else None))
    assert await store.delete("t", rid("r3"))
    assert await store.get_chain("t", rid("r5")) is None
    assert await store.get_chain("t", rid("r2")) is not None
    short = RedisResponseStore(redis_url, max_chain=2)
    try:
        assert await short.get_chain("t", rid("r2")) is not None
        await short.put(_stored("t", rid("s1"), None))
        await short.put(_stored("t", rid("s2"), rid("s1")))
        await short.put(_stored("t", rid("s3"), rid("s2")))
        assert await short.get_chain("t", rid("s3")) is None
    finally:
        await short.aclose()


async def test_writing_a_child_pushes_the_chain_expiry_out(redis_url: str, redis_admin: Any) -> None:
    store = RedisResponseStore(redis_url, ttl_s=600)
    client = redis_admin
    try:
        await store.put(_stored("t", rid("r1"), None))
        await store.put(_stored("t", rid("r2"), rid("r1")))
        (key1,) = list(client.scan_iter(match="*:" + rid("r1")))
        client.pexpire(key1, 5_000)
        await store.put(_stored("t", rid("r3"), rid("r2")))
        assert client.pttl(key1) > 500_000  # refreshed with the new turn
        client.pexpire(key1, 1)
        for _ in range(10_000):
            if not client.exists(key1):
                break
        assert await store.get_chain("t", rid("r3")) is None  # an expired link: the chain is gone
    finally:
        await store.aclose()


async def test_size_limits(redis_url: str) -> None:
    snap = LogDelta(b"fp", 0, (Segment(b"\x00" * 4000, 0, (-1, -1, False)),), b"")
    store = RedisResponseStore(redis_url, max_record_bytes=2_000, max_snapshot_bytes=1_000)
    try:
        await store.put(_stored("t", "small", None, "x", snap))
        got = await store.get("t", "small")
        assert got is not None and got.snapshot is None  # the snapshot was left out
        assert store.oversized_snapshots == 1
        await store.put(_stored("t", "big", None, "x" * 5_000))
        assert await store.get("t", "big") is None  # over the record limit: not stored
        assert store.oversized_records == 1
    finally:
        await store.aclose()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# (A Sentinel URL whose Sentinels are all down fails the same way, after redis-py's retries: ~4 s.)
@pytest.mark.parametrize("url", ["redis://127.0.0.1:{port}/0", "redis+cluster://127.0.0.1:{port}"])
async def test_an_unreachable_store_is_an_error_envelope_never_a_500(url: str) -> None:
    store = RedisResponseStore(url.format(port=_closed_port()))
    with pytest.raises(StoreUnavailable):
        await store.get_chain("t", rid("r1"))
    app = create_app(store=store)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        body = {"model": "sim-1", "input": "hi", "previous_response_id": "resp_1"}
        reply = await client.post("/v1/responses", json=body)
        assert reply.status_code == 503
        assert reply.json()["error"]["code"] == "store_unavailable"
        # A new conversation still completes; the failed write is logged and counted.
        reply = await client.post("/v1/responses", json={"model": "sim-1", "input": "hi"})
        assert reply.status_code == 200 and reply.json()["status"] == "completed"
        assert app.state.metrics.total("store_errors_total") == 1
    await store.aclose()


async def test_an_unreadable_record_is_missing_and_an_unreadable_snapshot_left_out(
    store: RedisResponseStore, redis_admin: Any
) -> None:
    snap = LogDelta(b"fp", 0, (), b"")
    await store.put(_stored("t", rid("r1"), None, "x", snap))
    await store.put(_stored("t", rid("r2"), rid("r1"), "y", snap))
    client = redis_admin
    (key2,) = list(client.scan_iter(match="*:" + rid("r2")))
    client.hset(key2, "s", b"\xc1 not msgpack")
    chain = await store.get_chain("t", rid("r2"))
    assert chain is not None and chain[0].snapshot == snap and chain[1].snapshot is None
    (key1,) = list(client.scan_iter(match="*:" + rid("r1")))
    client.hset(key1, "d", b"\x93garbage")
    assert await store.get_chain("t", rid("r2")) is None
    assert await store.get("t", rid("r1")) is None
    assert store.unreadable == 3


async def test_a_continuation_must_carry_its_parents_chain_tag(store: RedisResponseStore) -> None:
    root = new_response_id()
    await store.put(_stored("t", root, None))
    with pytest.raises(ValueError, match="chain tag"):
        await store.put(_stored("t", new_response_id(), root))  # a fresh id: another conversation's tag
    child = new_response_id(root)
    await store.put(_stored("t", child, root))
    chain = await store.get_chain("t", child)
    assert chain is not None and [s.id for s in chain] == [root, child]


async def test_one_tenants_conversations_spread_over_the_cluster(redis_deployment: Callable[[str], str]) -> None:
    """Each conversation keeps to one slot, yet one tenant's conversations use every node."""
    redis_cluster = redis_deployment("cluster")
    store = RedisResponseStore(redis_cluster)
    try:
        ends = []
        for _ in range(24):
            first = new_response_id()
            await store.put(_stored("t", first, None))
            second = new_response_id(first)
            await store.put(_stored("t", second, first))
            ends.append((first, second))
        for first, second in ends:
            chain = await store.get_chain("t", second)
            assert chain is not None and [s.id for s in chain] == [first, second]
        nodes = node_clients(redis_cluster)
        sizes = [node.dbsize() for node in nodes]
        for node in nodes:
            node.close()
        assert len(sizes) == 3 and all(sizes) and sum(sizes) == 48
    finally:
        await store.aclose()


async def test_a_conversation_stored_before_chain_tags_keeps_its_keys_and_continues(
    store: RedisResponseStore, redis_admin: Any
) -> None:
    first, second = new_id("resp"), new_id("resp")  # ids as this server made them before chain tags
    await store.put(_stored("t", first, None))
    await store.put(_stored("t", second, first))
    third = new_response_id(second)
    assert len(third) == len(second)  # untagged too: it stays with its conversation
    await store.put(_stored("t", third, second))
    chain = await store.get_chain("t", third)
    assert chain is not None and [s.id for s in chain] == [first, second, third]
    assert redis_admin.exists(f"rc:{{{b't'.hex()}}}:{first}")  # the earlier versions' key name
