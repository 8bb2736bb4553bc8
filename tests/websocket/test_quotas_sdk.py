"""Per-tenant quotas over WebSocket with the official SDK as the client: over a limit, an
``error`` event 429 ``rate_limit_exceeded`` with the retry time (in its message and its
``headers``), the socket kept open and the parent kept, so the same create succeeds on the same
socket once the quota allows; the open-connections quota refuses the upgrade with HTTP 429. The
counters' clock is the test's: nothing waits for a bucket to refill."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest
from openai import OpenAI
from wsclient import check_event

from responses_cache import SimulatedConfig, SimulatedEngine
from responses_cache.backends.base import BackendEvent, GenerationRequest
from responses_cache.limits.quotas import MemoryRateLimiter, Quota, QuotaConfig
from responses_cache.testing import LogicalClock, RecordingBackend

KEY = "sk-a"



class HeldBackend(RecordingBackend):
    """Each generation waits (on the server's thread) until the test lets one go."""

    def __init__(self) -> None:
        super().__init__(SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=3)))
        self.go = threading.Semaphore(0)
        self.entered = threading.Event()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self.requests.append(request)
        self.entered.set()
        if not await asyncio.to_thread(self.go.acquire, True, 10):
            raise RuntimeError("never let go")
        async for event in self.inner.generate(request):
            yield event


def _serve(factory: Callable[..., Any], quota: Quota, clock: LogicalClock, **options: Any) -> tuple[Any, MemoryRateLimiter]:
    limiter = MemoryRateLimiter(clock=clock)
    options.setdefault("backend", SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=5)))
    server = factory(api_keys={KEY: "a"}, quotas=QuotaConfig(quota), rate_limiter=limiter, **options)
    return server, limiter


def _until_end(conn: Any, lane: str | None = None) -> dict[str, Any]:
    """The frame that ends the (lane's) response: a terminal event or an ``error``."""
    while True:
        frame = json.loads(conn.recv_bytes())
        if frame.get("stream_id") != lane:
            continue
        if frame["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return frame


def _refused(frame: dict[str, Any]) -> dict[str, str]:
    check_event(frame)  # the SDK's own event type, strictly
    assert frame["type"] == "error" and frame["status"] == 429, frame
    assert frame["error"]["code"] == "rate_limit_exceeded"
    headers: dict[str, str] = frame["headers"]
    assert "Please try again in" in frame["error"]["message"]
    return headers


def test_requests_per_minute_over_websocket(responses_cache_server_factory: Any) -> None:
    clock = LogicalClock()
    server, _ = _serve(responses_cache_server_factory, Quota(requests_per_minute=1), clock)
    client = OpenAI(base_url=server.http_url, api_key=KEY, max_retries=0)
    with client, client.responses.connect() as conn:
        conn.response.create(model="sim-1", input="first", store=False)
        first = _until_end(conn)
        assert first["type"] == "response.completed"
        follow_up: dict[str, Any] = {
            "model": "sim-1", "input": "second", "store": False, "previous_response_id": first["response"]["id"],
        }
        conn.response.create(**follow_up)
        headers = _refused(_until_end(conn))
        assert headers["retry-after"] == "60" and headers["x-ratelimit-remaining-requests"] == "0"
        assert headers["x-ratelimit-limit-requests"] == "1"
        clock.now += 60.0
        conn.response.create(**follow_up)  # the same socket, the same parent: it was kept
        second = _until_end(conn)
    assert second["type"] == "response.completed"
    assert second["response"]["previous_response_id"] == first["response"]["id"]


def test_tokens_per_minute_over_websocket(responses_cache_server_factory: Any) -> None:
    clock = LogicalClock()
    server, _ = _serve(responses_cache_server_factory, Quota(tokens_per_minute=100), clock)
    client = OpenAI(base_url=server.http_url, api_key=KEY, max_retries=0)
    used = 0
    with client, client.responses.connect() as conn:
        for _ in range(2):  # each about 64 tokens: the second is admitted and leaves a debt
            conn.response.create(model="sim-1", input="hello there", store=False)
            done = _until_end(conn)
            assert done["type"] == "response.completed"
            used += done["response"]["usage"]["input_tokens"] + done["response"]["usage"]["output_tokens"]
        assert used > 100
        conn.response.create(model="sim-1", input="hello there", store=False)
        headers = _refused(_until_end(conn))
        assert int(headers["retry-after-ms"]) == pytest.approx((used - 100) * 60 / 100 * 1000, abs=1)
        assert headers["x-ratelimit-remaining-tokens"] == "0"
        clock.now += (used - 100) * 60 / 100
        conn.response.create(model="sim-1", input="hello there", store=False)
        assert _until_end(conn)["type"] == "response.completed"


def test_concurrent_responses_over_websocket(responses_cache_server_factory: Any) -> None:
    backend = HeldBackend()
    server, limiter = _serve(responses_cache_server_factory, Quota(concurrent_responses=1), LogicalClock(), backend=backend)
    client = OpenAI(base_url=server.http_url, api_key=KEY, max_retries=0)
    with client, client.responses.connect() as conn:
        conn.response.create(model="sim-1", input="long one", store=False, stream_id="one")
        assert backend.entered.wait(10)
        conn.response.create(model="sim-1", input="another", store=False, stream_id="two")
        headers = _refused(_until_end(conn, "two"))
        assert headers["retry-after"] == "1"
        backend.go.release()
        assert _until_end(conn, "one")["type"] == "response.completed"
        for _ in range(2):  # refused before it runs (no such parent): its slot is freed all the same
            conn.response.create(model="sim-1", input="x", store=False, stream_id="two", previous_response_id="resp_gone")
            assert _until_end(conn, "two")["error"]["code"] == "previous_response_not_found"
        backend.go.release()
        conn.response.create(model="sim-1", input="now", store=False, stream_id="two")
        assert _until_end(conn, "two")["type"] == "response.completed"
    assert limiter.running("a") == 0


def test_open_connections_refuse_the_upgrade_with_429(responses_cache_server_factory: Any) -> None:
    server, limiter = _serve(responses_cache_server_factory, Quota(connections=1), LogicalClock())
    client = OpenAI(base_url=server.http_url, api_key=KEY, max_retries=0)
    with client:
        with client.responses.connect() as conn:
            conn.response.create(model="sim-1", input="hi", store=False)
            assert _until_end(conn)["type"] == "response.completed"
            with pytest.raises(Exception) as refused, client.responses.connect() as second:
                second.response.create(model="sim-1", input="hi", store=False)
            assert "429" in str(refused.value)
        deadline = time.monotonic() + 10
        while limiter.connections("a") and time.monotonic() < deadline:
            time.sleep(0.01)  # the server frees the slot as its side of the socket ends
        assert limiter.connections("a") == 0
        with client.responses.connect() as conn:
            conn.response.create(model="sim-1", input="again", store=False)
            assert _until_end(conn)["type"] == "response.completed"
