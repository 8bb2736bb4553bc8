"""Quotas across two ``responses-cache serve`` processes on one Redis: configured in the
``quotas`` setting (by API key), counted in Redis, so requests, tokens and open connections are
limited for the tenant as a whole, whichever process a request reaches."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from responses_cache.testing import serve_in_process

ALICE, BOB, CAROL = "sk-alice", "sk-bob", "sk-carol"
QUOTAS = {
    ALICE: {"requests_per_minute": 3},
    BOB: {"tokens_per_minute": 100},
    "*": {"connections": 1},
}


@pytest.fixture
def ports(tmp_path: Path, redis_url: str) -> Iterator[tuple[int, int]]:
    # Processes sharing a store share one sealing key (serve refuses to start without it).
    env = {**os.environ, "RESPONSES_CACHE_QUOTAS": json.dumps(QUOTAS), "RESPONSES_CACHE_SEALING_KEY": "A" * 43 + "="}
    args = ("--store", redis_url, "--api-key", ALICE, "--api-key", BOB, "--api-key", CAROL, "--instant")
    started = [serve_in_process(*args, env=env, log=tmp_path / f"{name}.log", wait=False) for name in ("a", "b")]
    try:
        for server in started:  # both start at once
            server.wait_ready()
        yield started[0].port, started[1].port
    finally:
        for server in started:
            server.stop(15)


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _create(port: int, key: str, text: str = "hello there") -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/responses", json={"model": "sim-1", "input": text}, headers=_auth(key), timeout=30
    )


def test_quotas_hold_across_two_processes(ports: tuple[int, int]) -> None:
    a, b = ports
    # Requests per minute: 3 for alice, whichever process takes them.
    assert [_create(p, ALICE).status_code for p in (a, b, a)] == [200, 200, 200]
    refused = _create(b, ALICE)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1 and refused.headers["x-ratelimit-limit-requests"] == "3"
    assert _create(b, CAROL).status_code == 200  # another tenant is not affected

    # Tokens per minute: what bob used on process a refuses him on process b.
    used = 0
    for _ in range(2):
        done = _create(a, BOB)
        assert done.status_code == 200
        used += done.json()["usage"]["input_tokens"] + done.json()["usage"]["output_tokens"]
    assert used > 100
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # process a sends the charge within its flush interval
        status = httpx.get(f"http://127.0.0.1:{b}/v1/models", headers=_auth(BOB), timeout=5)
        if status.headers["x-ratelimit-remaining-tokens"] == "0":
            break
        time.sleep(0.01)
    refused = _create(b, BOB)
    assert refused.status_code == 429 and "tokens per minute" in refused.json()["error"]["message"]

    # Open connections: one per tenant, both processes together.
    with connect(f"ws://127.0.0.1:{a}/v1/responses", additional_headers=_auth(CAROL)):
        with pytest.raises(InvalidStatus) as denied, connect(f"ws://127.0.0.1:{b}/v1/responses", additional_headers=_auth(CAROL)):
            pass
        assert denied.value.response.status_code == 429
        assert "retry-after" in {k.lower() for k in denied.value.response.headers}
