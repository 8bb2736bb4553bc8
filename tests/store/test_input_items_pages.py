"""``GET /v1/responses/{id}/input_items`` pages, on the in-memory store and the Redis store:
``has_more`` is true exactly when items are left after the page, so a client that follows it
(the SDKs' auto-pagination) stops on the last page, and ``first_id``/``last_id`` name the page's
ends. Every page is checked: each ``limit`` from 1 to past the end, from the start and after
each item as cursor, in both orders, including the pages that end exactly on the last item."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from responses_cache import create_app
from responses_cache.backends.simulated import SimulatedConfig, SimulatedEngine
from responses_cache.storage.redis_store import RedisResponseStore

MODEL = "sim-1"
FIVE = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "list the files"},
    {"role": "user", "content": "and be quick"},
]


@pytest.fixture(params=["memory", "redis"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    options: dict[str, Any] = {"backend": SimulatedEngine(SimulatedConfig(instant=True))}
    if request.param == "redis":
        options.update(store=RedisResponseStore(request.getfixturevalue("single_redis_url")), own_store=True)
    app = create_app(**options)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://t/v1") as http:
        yield http


async def _create(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    answer = await client.post("/responses", json={"model": MODEL, **body})
    assert answer.status_code == 200, answer.text
    rid: str = answer.json()["id"]
    return rid


async def _page(client: httpx.AsyncClient, rid: str, **query: Any) -> dict[str, Any]:
    answer = await client.get(f"/responses/{rid}/input_items", params=query)
    assert answer.status_code == 200, answer.text
    page: dict[str, Any] = answer.json()
    return page


async def _check_every_page(client: httpx.AsyncClient, rid: str, count: int) -> None:
    for order in ("asc", "desc"):
        everything = (await _page(client, rid, order=order, limit=100))["data"]
        assert len(everything) == count and not (await _page(client, rid, order=order, limit=100))["has_more"]
        ids = [item["id"] for item in everything]
        for start in range(count + 1):  # from the start, then after each item
            cursor = {"after": ids[start - 1]} if start else {}
            for limit in range(1, count + 2):
                page = await _page(client, rid, order=order, limit=limit, **cursor)
                want = ids[start : start + limit]
                where = (order, start, limit)
                assert [item["id"] for item in page["data"]] == want, where
                assert page["has_more"] is (start + limit < count), where
                assert page["first_id"] == (want[0] if want else None), where
                assert page["last_id"] == (want[-1] if want else None), where


async def test_exactly_five_items_with_limit_five_is_the_last_page(client: httpx.AsyncClient) -> None:
    rid = await _create(client, {"input": FIVE})
    whole = await _page(client, rid, limit=5)
    assert len(whole["data"]) == 5 and whole["has_more"] is False
    first = await _page(client, rid, limit=2, order="asc")
    assert first["has_more"] is True
    rest = await _page(client, rid, limit=3, order="asc", after=first["last_id"])  # exactly what is left
    assert len(rest["data"]) == 3 and rest["has_more"] is False


async def test_has_more_on_every_page(client: httpx.AsyncClient) -> None:
    first = await _create(client, {"input": FIVE})
    await _check_every_page(client, first, 5)
    second = await _create(client, {"input": "one more", "previous_response_id": first})
    # The first's five inputs, its output (one message), then the second's own input.
    await _check_every_page(client, second, 7)


async def test_following_has_more_visits_each_item_once(client: httpx.AsyncClient) -> None:
    """A client that pages with ``after`` while ``has_more`` says so (as the SDKs do)."""
    first = await _create(client, {"input": FIVE})
    second = await _create(client, {"input": "one more", "previous_response_id": first})
    for limit in (1, 2, 3, 7, 20):
        seen: list[str] = []
        query: dict[str, Any] = {"limit": limit, "order": "asc"}
        while True:
            page = await _page(client, second, **query)
            assert page["data"], (limit, seen)  # never an empty page after has_more: true
            seen += [item["id"] for item in page["data"]]
            if not page["has_more"]:
                break
            query["after"] = page["last_id"]
        assert len(seen) == len(set(seen)) == 7, limit
