"""What ``store: true`` responses make ``responses-cache serve`` hold, measured as the server's
resident memory (``/proc``): 200 stored responses of about 0.45 MB each, sent over HTTP by one
tenant, raise the RSS by about the in-memory store's byte bound, not by their sum (before the
bound: about 0.5 MB each, 100 MB). Nothing is timed."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from responses_cache.testing import ServeProcess, serve_in_process

pytestmark = [
    pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from /proc"),
    pytest.mark.subprocess,
    pytest.mark.slow,
]

MIB = 1024 * 1024
BOUND = 16 * MIB  # the store's bound in this test, all tenants and per tenant
WORDS = "the quick brown fox jumps over the lazy dog and runs far away "


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def server() -> Iterator[ServeProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_CACHE_")}  # the defaults,
    # but the tenant's input rate off: its 2 MiB/s after 16 MiB would pace these 90 MB for ~35 s
    env["RESPONSES_CACHE_TENANT_INPUT_BYTES_PER_S"] = "0"
    served = serve_in_process(
        "--instant", "--store-max-bytes", str(BOUND), "--store-max-tenant-bytes", str(BOUND), env=env
    )
    try:
        yield served
    finally:
        served.kill()


def _text(i: int) -> str:
    return f"{i} " + (WORDS * 7300)[: 450_000]  # about 0.45 MB and 90k tokens


def test_stored_responses_hold_about_the_stores_bound(server: ServeProcess) -> None:
    with httpx.Client(base_url=server.http_url.removesuffix("/v1"), timeout=120) as client:

        def create(i: int, previous: str | None = None) -> str:
            body = {"model": "sim-1", "input": _text(i), "max_output_tokens": 16}
            if previous is not None:
                body["previous_response_id"] = previous
            reply = client.post("/v1/responses", json=body)
            assert reply.status_code == 200, reply.text
            answer: str = reply.json()["id"]
            return answer

        for i in range(3):  # warm up what every process builds once (tokenizer tables)
            create(i)
        before = _rss(server.proc.pid)
        ids = [create(i) for i in range(200)]  # 90 MB were they all kept
        growth = _rss(server.proc.pid) - before
        assert client.get(f"/v1/responses/{ids[-1]}").status_code == 200
        assert client.get(f"/v1/responses/{ids[0]}").status_code == 404
    print(f"RSS grew {growth / MIB:.1f} MiB for 200 stored responses of 0.45 MB (bound {BOUND / MIB:.0f} MiB)")
    assert growth <= 3 * BOUND, f"RSS grew {growth / MIB:.1f} MiB"
