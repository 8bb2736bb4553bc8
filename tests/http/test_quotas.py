"""Per-tenant quotas over HTTP: OpenAI's ``x-ratelimit-*`` headers on every answer, 429 with
``Retry-After`` over a limit, tokens charged as billed (from the token log), concurrent responses
counted; and fair engine slots across tenants (counted, not timed). The clock of the counters is
the test's, so nothing waits for a bucket to refill."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from responses_cache import SimulatedConfig, SimulatedEngine, create_app
from responses_cache.conversation.sealing import Sealer, new_key
from responses_cache.limits.quotas import MemoryRateLimiter, Quota, QuotaConfig
from responses_cache.testing import LogicalClock
from tests.asgi_turns import asgi_client, until
from tests.held_backend import HeldBackend

KEYS = {"sk-a": "a", "sk-b": "b"}
A = {"authorization": "Bearer sk-a"}
B = {"authorization": "Bearer sk-b"}
RATE_HEADERS = (
    "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens",
)


def _app(quota: Quota, clock: LogicalClock, **options: Any) -> Any:
    options.setdefault("backend", SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=5)))
    return create_app(api_keys=KEYS, quotas=QuotaConfig(quota), rate_limiter=MemoryRateLimiter(clock=clock), **options)


def _create(**extra: Any) -> dict[str, Any]:
    return {"model": "sim-1", "input": "hello there", **extra}


async def test_every_answer_carries_the_rate_limit_headers() -> None:
    clock = LogicalClock()
    app = _app(Quota(requests_per_minute=10, tokens_per_minute=10_000), clock)
    async with asgi_client(app) as client:
        created = await client.post("/responses", json=_create(), headers=A)
        streamed = await client.post("/responses", json=_create(stream=True), headers=A)
        rid = created.json()["id"]
        answers = [
            created, streamed,
            await client.get("/models", headers=A),
            await client.get(f"/responses/{rid}", headers=A),
            await client.get(f"/responses/{rid}/input_items", headers=A),
            await client.post("/responses/input_tokens", json=_create(), headers=A),
            await client.get("/responses/resp_missing", headers=A),  # a 404 too
            await client.delete(f"/responses/{rid}", headers=A),
        ]
    for answer in answers:
        assert all(name in answer.headers for name in RATE_HEADERS), answer.request.url
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["9", "8", *["8"] * 6]
    assert created.headers["x-ratelimit-limit-requests"] == "10"
    assert created.headers["x-ratelimit-reset-requests"] == "6s"  # one request, at 10 a minute
    assert "retry-after" not in created.headers


async def test_requests_per_minute_give_429_with_retry_after() -> None:
    clock = LogicalClock()
    app = _app(Quota(requests_per_minute=2), clock)
    async with asgi_client(app) as client:
        for _ in range(2):
            assert (await client.post("/responses", json=_create(), headers=A)).status_code == 200
        refused = await client.post("/responses", json=_create(), headers=A)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.headers["retry-after"] == "30" and refused.headers["retry-after-ms"] == "30000"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert "30s" in refused.json()["error"]["message"]
        assert (await client.post("/responses", json=_create(), headers=B)).status_code == 200  # B has its own
        clock.now += 30.0
        assert (await client.post("/responses", json=_create(), headers=A)).status_code == 200


async def test_tokens_per_minute_are_charged_as_billed() -> None:
    clock = LogicalClock()
    app = _app(Quota(tokens_per_minute=600), clock)
    async with asgi_client(app) as client:
        first = await client.post("/responses", json=_create(), headers=A)
        usage = first.json()["usage"]
        used = usage["input_tokens"] + usage["output_tokens"]
        status = await client.get("/models", headers=A)
        assert int(status.headers["x-ratelimit-remaining-tokens"]) == 600 - used  # exactly what was billed
        long_input = "word " * 700  # about 700 prompt tokens: the bucket goes into debt
        second = await client.post("/responses", json=_create(input=long_input), headers=A)
        assert second.status_code == 200  # admitted: the bucket was above zero
        debt = used + second.json()["usage"]["input_tokens"] + second.json()["usage"]["output_tokens"] - 600
        assert debt > 0
        refused = await client.post("/responses", json=_create(), headers=A)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == str(math.ceil(debt * 60 / 600))
        assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
        clock.now += debt * 60 / 600
        assert (await client.post("/responses", json=_create(), headers=A)).status_code == 200


async def test_concurrent_responses_over_http() -> None:
    clock = LogicalClock()
    backend = HeldBackend()
    app = _app(Quota(concurrent_responses=1), clock, backend=backend)
    async with asgi_client(app) as client:
        running = asyncio.ensure_future(client.post("/responses", json=_create(), headers=A))
        await until(lambda: len(backend.requests) == 1)
        refused = await client.post("/responses", json=_create(), headers=A)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert "concurrent responses" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"] == "1"
        backend.go.release()
        assert (await asyncio.wait_for(running, 10)).status_code == 200
        backend.go.release()
        assert (await client.post("/responses", json=_create(), headers=A)).status_code == 200  # the slot came back


async def test_a_refused_body_still_frees_its_slot() -> None:
    app = _app(Quota(concurrent_responses=1), LogicalClock())
    async with asgi_client(app) as client:
        for _ in range(3):
            bad = await client.post("/responses", json={"model": "sim-1", "input": [1]}, headers=A)
            assert bad.status_code == 400
        assert (await client.post("/responses", json=_create(), headers=A)).status_code == 200


async def test_engine_slots_are_shared_round_robin_across_tenants() -> None:
    backend = HeldBackend()
    app = create_app(api_keys=KEYS, backend=backend, engine_slots=1)
    gate = app.state.service.core.pipeline.engine_gate
    async with asgi_client(app) as client:
        busy = [asyncio.ensure_future(client.post("/responses", json=_create(), headers=A)) for _ in range(4)]
        await until(lambda: len(backend.requests) == 1 and gate.waiting == 3)
        quiet = asyncio.ensure_future(client.post("/responses", json=_create(priority=2), headers=B))
        await until(lambda: gate.waiting == 4)
        for n in range(1, 6):
            backend.go.release()
            await until(lambda n=n: len(backend.requests) == min(n + 1, 5) and backend.go.locked())
        answers = await asyncio.wait_for(asyncio.gather(*busy, quiet), 10)
    assert all(a.status_code == 200 for a in answers)
    tenants = [r.tenant for r in backend.requests]
    assert tenants == ["a", "a", "b", "a", "a"]  # b's one turn goes second in line, not after a's four
    assert backend.requests[2].priority == 2 and backend.requests[0].priority is None


async def test_a_compaction_on_demand_waits_for_an_engine_slot_and_frees_it() -> None:
    backend = HeldBackend()
    app = create_app(api_keys=KEYS, backend=backend, engine_slots=1, sealer=Sealer.from_text(new_key()))
    gate = app.state.service.core.pipeline.engine_gate
    async with asgi_client(app) as client:
        running = asyncio.ensure_future(client.post("/responses", json=_create(), headers=A))
        await until(lambda: len(backend.requests) == 1)
        compacting = asyncio.ensure_future(client.post("/responses/compact", json=_create(), headers=B))
        await until(lambda: gate.waiting == 1)  # the summary waits in b's queue, the engine untouched
        assert len(backend.requests) == 1
        backend.go.release()
        await until(lambda: len(backend.requests) == 2)
        backend.go.release()
        answers = await asyncio.wait_for(asyncio.gather(running, compacting), 10)
        assert [a.status_code for a in answers] == [200, 200]
        assert answers[1].json()["object"] == "response.compaction"
        assert gate.free == 1  # the summary gave its slot back


@pytest.mark.parametrize("priority", [True, "high", 1.5])
async def test_a_bad_priority_is_a_400(priority: object) -> None:
    app = create_app(api_keys=KEYS)
    async with asgi_client(app) as client:
        refused = await client.post("/responses", json=_create(priority=priority), headers=A)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority"


async def test_a_background_response_holds_its_slot_until_it_ends_and_is_charged() -> None:
    clock = LogicalClock()
    backend = HeldBackend()
    app = _app(Quota(concurrent_responses=1, tokens_per_minute=10_000), clock, backend=backend)
    async with asgi_client(app) as client:
        queued = await client.post("/responses", json=_create(background=True), headers=A)
        assert queued.status_code == 200 and queued.json()["status"] == "queued"
        await until(lambda: len(backend.requests) == 1)
        refused = await client.post("/responses", json=_create(), headers=A)  # the background one runs
        assert refused.status_code == 429
        backend.go.release()
        rid = queued.json()["id"]
        done: dict[str, Any] = {}
        for _ in range(1000):
            done = (await client.get(f"/responses/{rid}", headers=A)).json()
            if done["status"] == "completed":
                break
            await asyncio.sleep(0)
        assert done["status"] == "completed"
        used = done["usage"]["input_tokens"] + done["usage"]["output_tokens"]
        await until(lambda: app.state.service.core.quotas.limiter.running("a") == 0)
        status = await client.get("/models", headers=A)
        assert int(status.headers["x-ratelimit-remaining-tokens"]) == 10_000 - used
        backend.go.release()
        assert (await client.post("/responses", json=_create(), headers=A)).status_code == 200
