"""Input token counts and input items with the Redis store: another process counts from the
stored token-log snapshot (only the new items rendered), and lists the stored items."""

from __future__ import annotations

from typing import Any

import httpx

from responses_cache import create_app
from responses_cache.backends.simulated import SimulatedConfig, SimulatedEngine
from responses_cache.storage.redis_store import RedisResponseStore
from tests.asgi_turns import conversation, post, renderer_of


async def _count_work(app: Any, previous: str) -> tuple[int, int]:
    renderer = renderer_of(app)
    before = renderer.stats.items_rendered
    counted = await post(app, "/v1/responses/input_tokens", {"input": "one more", "previous_response_id": previous})
    return renderer.stats.items_rendered - before, counted["input_tokens"]


async def test_counting_from_a_snapshot_on_another_process_renders_only_the_new_items(redis_url: str) -> None:
    a = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True)), store=RedisResponseStore(redis_url), own_store=True)
    b = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True)), store=RedisResponseStore(redis_url), own_store=True)
    async with a.router.lifespan_context(a), b.router.lifespan_context(b):
        previous = await conversation(a, 6)
        work, count = await _count_work(b, previous)
        assert work == 1 and b.state.service.core.snapshot_restores == 1
        created = await post(a, "/v1/responses", {"input": "one more", "previous_response_id": previous})
        assert count == created["usage"]["input_tokens"]
        # input items from the Redis store, tenant-scoped like every key there
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=b), base_url="http://t") as client:
            listed = (await client.get(f"/v1/responses/{previous}/input_items?order=asc&limit=100")).json()
        assert len(listed["data"]) == 6 * 2 - 1 and listed["data"][-1]["content"][0]["text"].startswith("turn 5")
