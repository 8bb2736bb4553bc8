"""The in-memory store's byte bounds, counted in :func:`stored_bytes` (nothing timed): one tenant
cannot push another's responses out, the process bound holds after every put, the least recently
used go first, and a response still running in the background stays."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import msgspec
import pytest

from responses_cache.protocol.items import FunctionCall, FunctionCallOutput, Message, OutputText
from responses_cache.protocol.response import Response
from responses_cache.storage.store import Bound, MemoryResponseStore, StoredResponse, stored_bytes


def _stored(tenant: str, n: int, size: int = 1000, status: str = "completed") -> StoredResponse:
    """A response of about ``size`` bytes of tool output, a call and an answer."""
    response = Response(
        id=f"resp_{tenant}_{n:06d}", created_at=0, status=status,  # type: ignore[arg-type]
        model="m", tools=msgspec.Raw(b"[]"), tool_choice="auto", parallel_tool_calls=True,
        output=[
            FunctionCall(call_id=f"call_{n}", name="shell", arguments='{"cmd": "ls -la"}', id=f"fc_{n:020d}"),
            Message(role="assistant", content=[OutputText(text=f"answer {n} " * 8)], id=f"msg_{n:020d}"),
        ],
    )
    output = FunctionCallOutput(call_id=f"call_{n - 1}", output="x" * size + str(n))
    return StoredResponse(tenant, response, (output,), None, b"[]")


def _store(max_bytes: int, max_tenant_bytes: int, evictions: list[Bound] | None = None) -> MemoryResponseStore:
    def evicted(bound: Bound, tenant: str, response_id: str) -> None:
        assert response_id.startswith(f"resp_{tenant}_")
        if evictions is not None:
            evictions.append(bound)

    return MemoryResponseStore(max_bytes=max_bytes, max_tenant_bytes=max_tenant_bytes, evicted=evicted)


async def _kept(store: MemoryResponseStore, tenant: str, count: int) -> list[int]:
    return [n for n in range(count) if await store.contains(tenant, f"resp_{tenant}_{n:06d}")]


async def test_one_tenant_cannot_push_another_tenants_responses_out() -> None:
    size = stored_bytes(_stored("noisy", 500))  # what each of the newest takes
    evictions: list[Bound] = []
    store = _store(max_bytes=100 * size, max_tenant_bytes=20 * size, evictions=evictions)
    for n in range(10):
        await store.put(_stored("quiet", n))
    for n in range(1000):  # a noisy tenant stores a hundred times its bound
        await store.put(_stored("noisy", n))
        assert store.tenant_bytes("noisy") <= 20 * size
    assert await _kept(store, "quiet", 10) == list(range(10))
    assert await _kept(store, "noisy", 1000) == list(range(980, 1000))  # its own newest
    assert evictions == ["tenant_bytes"] * 980


async def test_the_process_bound_holds_after_every_put() -> None:
    store = _store(max_bytes=200_000, max_tenant_bytes=80_000)
    entries: dict[tuple[str, str], int] = {}
    for n in range(600):
        stored = _stored(f"t{n % 7}", n, size=500 + 37 * (n % 50))
        await store.put(stored)
        entries[(stored.tenant, stored.id)] = stored_bytes(stored)
        held = [size for (tenant, rid), size in entries.items() if await store.contains(tenant, rid)]
        assert sum(held) == store.total_bytes <= 200_000
        assert all(store.tenant_bytes(f"t{k}") <= 80_000 for k in range(7))
    assert len(store) > 20  # it keeps what fits


async def test_the_least_recently_used_go_first() -> None:
    size = stored_bytes(_stored("a", 0))
    evictions: list[Bound] = []
    store = _store(max_bytes=5 * size, max_tenant_bytes=100 * size, evictions=evictions)
    for n in range(5):
        await store.put(_stored("a", n))
    assert await store.get("a", "resp_a_000001") is not None  # a read is a use
    await store.put(_stored("b", 0))
    await store.put(_stored("b", 1))
    assert await _kept(store, "a", 5) == [1, 3, 4]  # 0, then 2 (1 was read after it)
    assert evictions == ["bytes", "bytes"]
    assert len(store) == 5 and store.total_bytes <= 5 * size


async def test_the_response_count_bound_still_holds() -> None:
    evictions: list[Bound] = []
    store = MemoryResponseStore(3, evicted=lambda bound, tenant, response_id: evictions.append(bound))
    for n in range(5):
        await store.put(_stored("a", n))
    assert await _kept(store, "a", 5) == [2, 3, 4] and evictions == ["responses", "responses"]


async def test_a_response_running_in_the_background_is_not_evicted() -> None:
    size = stored_bytes(_stored("a", 0))
    store = _store(max_bytes=100 * size, max_tenant_bytes=3 * size)
    await store.put(_stored("a", 0, status="queued"))
    await store.put(_stored("a", 1, status="in_progress"))
    for n in range(2, 10):
        await store.put(_stored("a", n))
    assert await _kept(store, "a", 10) == [0, 1, 9]
    await store.put(_stored("a", 0))  # it ended: stored again, evictable like any other
    await store.put(_stored("a", 10))
    assert await _kept(store, "a", 11) == [1, 10]  # 9, then the ended 0 went


async def test_a_replaced_or_deleted_response_gives_its_bytes_back() -> None:
    store = _store(max_bytes=1_000_000, max_tenant_bytes=1_000_000)
    await store.put(_stored("a", 0, status="queued"))
    await store.put(_stored("a", 0, size=5000))  # the same id stored again
    assert store.total_bytes == store.tenant_bytes("a") == stored_bytes(_stored("a", 0, size=5000))
    assert await store.delete("a", "resp_a_000000") and store.total_bytes == store.tenant_bytes("a") == 0


async def test_a_response_larger_than_a_bound_is_not_kept() -> None:
    evictions: list[Bound] = []
    store = _store(max_bytes=50_000, max_tenant_bytes=20_000, evictions=evictions)
    await store.put(_stored("a", 0))
    await store.put(_stored("a", 1, size=30_000))
    assert await _kept(store, "a", 2) == [0] and evictions == ["tenant_bytes"]


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        MemoryResponseStore(max_bytes=0)
    with pytest.raises(ValueError):
        MemoryResponseStore(max_tenant_bytes=-1)


@pytest.mark.parametrize(("size", "count"), [(10, 2000), (2000, 1000), (450_000, 20)])
async def test_the_size_estimate_tracks_what_an_entry_holds(size: int, count: int) -> None:
    """``stored_bytes`` against the memory ``tracemalloc`` sees the store keep for each entry."""
    store = _store(max_bytes=1 << 40, max_tenant_bytes=1 << 40)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(count):
            await store.put(_stored("a", n, size=size))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.8 <= store.total_bytes / held <= 1.25, (store.total_bytes / count, held / count)


def test_the_bounds_are_serve_settings_and_counted_in_metrics() -> None:
    from responses_cache import create_app
    from responses_cache.observability.metrics import InMemoryMetrics
    from responses_cache.server.cli import server_config
    from responses_cache.server.settings import load_settings

    env = {"RESPONSES_CACHE_STORE_MAX_BYTES": "5000000"}
    settings = load_settings(env=env, overrides={"store_max_tenant_bytes": 5000})
    config = server_config(settings)
    assert (config.store_max_bytes, config.store_max_tenant_bytes) == (5_000_000, 5000)
    metrics = InMemoryMetrics()
    store = create_app(config, metrics=metrics).state.service.core.store
    assert isinstance(store, MemoryResponseStore) and (store.max_bytes, store.max_tenant_bytes) == (5_000_000, 5000)
    defaults = create_app().state.service.core.store
    assert (defaults.max_bytes, defaults.max_tenant_bytes) == (1024**3, 256 * 1024**2)
    for n in range(3):
        asyncio.run(store.put(_stored("a", n)))
    assert metrics.total("store_evictions_total", bound="tenant_bytes") == 2
