"""Every path that charges a tenant's token quota, read back as a client reads it: the
``x-ratelimit-remaining-tokens`` header of the next answer, and whether the next turns are let in.
Each runs on both limiters, the in-process one and the Redis one (counters in Redis, charges sent
with the tenant's next admission or in a batch), on the same app over HTTP (and over
WebSocket for a turn cancelled by its client leaving). What is charged is what
is billed: the sum of the usage records, summaries included (docs/limits.md, per-tenant quotas).

The Redis limiter's batch never flushes on its own here (``flush_s`` is an hour), so charges that
end close together wait in the process together, as they do between two flushes in production."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from responses_cache import SimulatedConfig, SimulatedEngine, create_app
from responses_cache.backends.base import BackendEvent, GenerationRequest
from responses_cache.billing.record import UsageRecord
from responses_cache.conversation.sealing import Sealer, new_key
from responses_cache.limits.quotas import MemoryRateLimiter, Quota, QuotaConfig, RateLimiter
from responses_cache.limits.redis_quotas import RedisRateLimiter
from responses_cache.testing import LogicalClock, RecordingBackend
from tests.asgi_turns import asgi_client, until
from tests.held_backend import HeldBackend

KEYS = {"sk-a": "a"}
A = {"authorization": "Bearer sk-a"}
TPM = 100_000


class Records:
    """The usage records billing receives (what the tenant is charged must equal their sum)."""

    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def submit(self, record: UsageRecord) -> None:
        self.records.append(record)

    @property
    def tokens(self) -> int:
        return sum(r.input_tokens + r.output_tokens for r in self.records)


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    clock = LogicalClock(1_700_000_000.0)  # never moves: no bucket refills during a test
    if request.param == "memory":
        yield MemoryRateLimiter(clock=clock)
        return
    url: str = request.getfixturevalue("single_redis_url")
    redis = RedisRateLimiter(url, clock=clock, flush_s=3600)
    yield redis
    await redis.aclose()


def _app(limiter: RateLimiter, quota: Quota, **options: Any) -> Any:
    options.setdefault("backend", SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=5)))
    return create_app(api_keys=KEYS, quotas=QuotaConfig(quota), rate_limiter=limiter, **options)


async def _remaining(client: httpx.AsyncClient) -> int:
    """The tenant's tokens as the next answer's headers tell them (an answer that counts nothing)."""
    status = await client.get("/models", headers=A)
    return int(status.headers["x-ratelimit-remaining-tokens"])


def _used(answer: httpx.Response) -> int:
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    return int(usage["input_tokens"] + usage["output_tokens"])


@pytest.mark.parametrize("tokens", [TPM, None], ids=["tokens", "slots-only"])
async def test_two_turns_ending_together_are_both_charged_and_free_both_slots(
    limiter: RateLimiter, tokens: int | None
) -> None:
    """Both charges are added up while they wait (not the second written over the first): the
    tokens of both are gone, and both concurrency slots come back (checked alone too, without a
    token quota, so a lost slot is seen even when the tokens are right)."""
    backend = HeldBackend()
    app = _app(limiter, Quota(tokens_per_minute=tokens, concurrent_responses=2), backend=backend)
    async with asgi_client(app) as client:
        both = [asyncio.ensure_future(client.post("/responses", json={"model": "sim-1", "input": f"turn {n}"}, headers=A))
                for n in range(2)]
        await until(lambda: len(backend.requests) == 2)
        backend.go.release()
        backend.go.release()
        used = sum(_used(a) for a in await asyncio.wait_for(asyncio.gather(*both), 10))
        if tokens is not None:
            assert await _remaining(client) == TPM - used
        # Both slots are free: two more turns run at once (a lost release refuses the second).
        again = [asyncio.ensure_future(client.post("/responses", json={"model": "sim-1", "input": f"more {n}"}, headers=A))
                 for n in range(2)]
        await until(lambda: len(backend.requests) == 4 or any(t.done() for t in again))
        backend.go.release()
        backend.go.release()
        answers = await asyncio.wait_for(asyncio.gather(*again), 10)
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        used += sum(_used(a) for a in answers)
        if tokens is not None:
            assert await _remaining(client) == TPM - used


async def test_a_compaction_on_demand_is_charged(limiter: RateLimiter) -> None:
    """``POST /v1/responses/compact``: the summary's usage (the answer's ``usage``) is charged."""
    records = Records()
    app = _app(limiter, Quota(tokens_per_minute=TPM), sealer=Sealer.from_text(new_key()), billing=records)
    async with asgi_client(app) as client:
        first = await client.post("/responses", json={"model": "sim-1", "input": "fix the parser"}, headers=A)
        used = _used(first)
        compacted = await client.post(
            "/responses/compact",
            json={"model": "sim-1", "input": "and the docs", "previous_response_id": first.json()["id"]},
            headers=A,
        )
        assert compacted.json()["object"] == "response.compaction"
        summary = _used(compacted)
        assert summary > 0
        assert await _remaining(client) == TPM - used - summary == TPM - records.tokens


async def test_an_automatic_compaction_is_charged_with_its_turn(limiter: RateLimiter) -> None:
    """``context_management``: the summary (its own usage record) is charged besides the turn."""
    records = Records()
    app = _app(limiter, Quota(tokens_per_minute=TPM), sealer=Sealer.from_text(new_key()), billing=records)
    managed = [{"type": "compaction", "compact_threshold": 200}]
    async with asgi_client(app) as client:
        previous = None
        compacted = False
        used = 0
        for n in range(12):
            answer = await client.post(
                "/responses",
                json={"model": "sim-1", "input": f"step {n}: " + "fix it " * 12, "previous_response_id": previous,
                      "context_management": managed},
                headers=A,
            )
            used += _used(answer)
            previous = answer.json()["id"]
            if answer.json()["output"][0]["type"] == "compaction":
                compacted = True
                break
        assert compacted, "no compaction happened"
        summaries = [r for r in records.records if r.response_id.startswith("cmp")]
        assert len(summaries) == 1 and summaries[0].input_tokens > 0
        assert records.tokens == used + summaries[0].input_tokens + summaries[0].output_tokens
        assert await _remaining(client) == TPM - records.tokens


async def test_a_background_response_is_charged_and_frees_its_slot(limiter: RateLimiter) -> None:
    app = _app(limiter, Quota(tokens_per_minute=TPM, concurrent_responses=1))
    async with asgi_client(app) as client:
        queued = await client.post("/responses", json={"model": "sim-1", "input": "hi", "background": True}, headers=A)
        assert queued.json()["status"] == "queued"
        rid = queued.json()["id"]
        done: dict[str, Any] = {}
        for _ in range(2000):
            done = (await client.get(f"/responses/{rid}", headers=A)).json()
            if done["status"] == "completed":
                break
            await asyncio.sleep(0)
        assert done["status"] == "completed"
        used = done["usage"]["input_tokens"] + done["usage"]["output_tokens"]
        assert used > 0
        await until(lambda: app.state.service.background.running == 0)
        for _ in range(100):  # the turn's charge goes in as it ends, just after its status is stored
            remaining = await _remaining(client)
            if remaining != TPM:
                break
            await asyncio.sleep(0)
        assert remaining == TPM - used
        after = await client.post("/responses", json={"model": "sim-1", "input": "next"}, headers=A)
        assert after.status_code == 200, after.text  # its slot came back


async def test_a_cancelled_background_response_is_charged_as_billed(limiter: RateLimiter) -> None:
    backend = HeldBackend()
    records = Records()
    app = _app(limiter, Quota(tokens_per_minute=TPM, concurrent_responses=1), backend=backend, billing=records)
    async with asgi_client(app) as client:
        queued = await client.post("/responses", json={"model": "sim-1", "input": "a long job " * 20, "background": True},
                                   headers=A)
        rid = queued.json()["id"]
        await until(lambda: len(backend.requests) == 1)
        cancelled = await client.post(f"/responses/{rid}/cancel", headers=A)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        await until(lambda: len(records.records) == 1)
        assert records.records[0].status == "cancelled" and records.tokens > 0  # its prompt was rendered
        for _ in range(100):
            remaining = await _remaining(client)
            if remaining != TPM:
                break
            await asyncio.sleep(0)
        assert remaining == TPM - records.tokens
        backend.go.release()
        after = await client.post("/responses", json={"model": "sim-1", "input": "next"}, headers=A)
        assert after.status_code == 200, after.text  # the cancelled one's slot came back


async def test_counting_input_tokens_charges_nothing(limiter: RateLimiter) -> None:
    """``POST /v1/responses/input_tokens`` is not a response: it counts neither a request nor
    tokens, and holds no slot (docs/limits.md counts creates and compactions only)."""
    app = _app(limiter, Quota(requests_per_minute=10, tokens_per_minute=TPM, concurrent_responses=1))
    async with asgi_client(app) as client:
        counted = await client.post("/responses/input_tokens", json={"model": "sim-1", "input": "how long is this"}, headers=A)
        assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
        status = await client.get("/models", headers=A)
        assert status.headers["x-ratelimit-remaining-requests"] == "10"
        assert int(status.headers["x-ratelimit-remaining-tokens"]) == TPM
        assert (await client.post("/responses", json={"model": "sim-1", "input": "go"}, headers=A)).status_code == 200


class ThreadHeldBackend(RecordingBackend):
    """Each generation waits (on the server's thread) until the test lets it go; never, here."""

    def __init__(self) -> None:
        super().__init__(SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=3)))
        self.entered = threading.Event()
        self.go = threading.Event()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self.requests.append(request)
        self.entered.set()
        while not self.go.is_set():
            await asyncio.sleep(0.005)
        async for event in self.inner.generate(request):
            yield event


@pytest.mark.parametrize("transport", ["websocket", "http-stream"])
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_turn_cancelled_by_its_client_leaving_is_charged_as_billed(
    request: pytest.FixtureRequest, responses_cache_server_factory: Callable[..., Any], kind: str, transport: str
) -> None:
    """A client that leaves mid-turn (closes its WebSocket, drops its stream): the turn is
    cancelled, billed ``cancelled`` with its prompt, and that is charged; its slot comes back."""
    clock = LogicalClock(1_700_000_000.0)
    chosen: RateLimiter = (
        MemoryRateLimiter(clock=clock) if kind == "memory"
        else RedisRateLimiter(request.getfixturevalue("single_redis_url"), clock=clock, flush_s=3600)
    )  # the server closes it as it stops
    backend, records = ThreadHeldBackend(), Records()
    server = responses_cache_server_factory(
        backend=backend, api_keys=KEYS, quotas=QuotaConfig(Quota(tokens_per_minute=TPM, concurrent_responses=1)),
        rate_limiter=chosen, billing=records,
    )
    body = {"model": "sim-1", "input": "a long job " * 20, "store": False}
    if transport == "websocket":
        ws_url = server.http_url.replace("http", "ws", 1) + "/responses"
        with ws_connect(ws_url, additional_headers=A) as ws:
            ws.send(json.dumps({"type": "response.create", **body}))
            assert backend.entered.wait(10)
    else:
        with httpx.Client(base_url=server.http_url, headers=A, timeout=10) as client, \
                client.stream("POST", "/responses", json={**body, "stream": True}) as stream:
            assert stream.status_code == 200
            assert backend.entered.wait(10)
    deadline = time.monotonic() + 10
    while not records.records and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [r.status for r in records.records] == ["cancelled"] and records.tokens > 0
    with httpx.Client(base_url=server.http_url, headers=A, timeout=10) as client:
        remaining = TPM
        while remaining == TPM and time.monotonic() < deadline:  # the release follows the record
            remaining = int(client.get("/models").headers["x-ratelimit-remaining-tokens"])
        assert remaining == TPM - records.tokens
        backend.go.set()
        after = client.post("/responses", json={"model": "sim-1", "input": "next"})
        assert after.status_code == 200, after.text  # the cancelled turn's slot came back
