"""Quotas across two ``responses-cache serve`` processes on one Redis: configured in the
``quotas`` setting (by API key), counted in Redis, so requests, tokens and open connections are
limited for the tenant as a whole, whichever process a request reaches."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from benchmarks.suite.server import stop_process

ALICE, BOB, CAROL = "sk-alice", "sk-bob", "sk-carol"
QUOTAS = {
    ALICE: {"requests_per_minute": 3},
    BOB: {"tokens_per_minute": 100},
    "*": {"connections": 1},
}


def _spawn(tmp: Path, name: str, store: str) -> tuple[int, subprocess.Popen[bytes], Path]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    env = {**os.environ, "RESPONSES_CACHE_QUOTAS": json.dumps(QUOTAS)}
    log = tmp / f"{name}.log"
    with log.open("wb") as err:  # a file, not a pipe: a chatty server never blocks on it
        proc = subprocess.Popen(
            [sys.executable, "-m", "responses_cache.cli", "serve", "--port", str(port), "--store", store,
             "--api-key", ALICE, "--api-key", BOB, "--api-key", CAROL, "--instant"],
            env=env, stdout=subprocess.DEVNULL, stderr=err,
        )
    return port, proc, log


def _ready(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=_auth(CAROL), timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError("serve did not start")


@pytest.fixture
def ports(tmp_path: Path, redis_url: str) -> Iterator[tuple[int, int]]:
    started = [_spawn(tmp_path, name, redis_url) for name in ("a", "b")]  # both start at once
    try:
        for port, proc, log in started:
            _ready(port, proc, log)
        yield started[0][0], started[1][0]
    finally:
        for _, proc, _ in started:
            stop_process(proc, 15)


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
