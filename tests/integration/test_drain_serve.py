"""``SIGTERM`` to a real ``responses-cache serve``, seen by the official SDK's WebSocket client:
the running turn finishes and then the connection closes with 1001 (which the SDK reconnects on),
an idle connection gets 1001 at once, readiness goes unready first, a turn longer than the
drain's deadline is cut and billed, a second signal stops at once, and the process exits 0 with
every usage record delivered."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import APIError, AsyncOpenAI

from responses_cache.testing import ServeProcess, serve_in_process

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

KEY = "sk-drain"


def _serve(
    tmp_path: Path, *, tokens_per_s: float, answer_tokens: int, drain_s: float, log_level: str = "warning"
) -> tuple[ServeProcess, Path]:
    tmp_path.mkdir(exist_ok=True)
    settings = tmp_path / "serve.toml"
    settings.write_text(f"[backend_options]\noutput_tokens_per_s = {tokens_per_s}\nanswer_tokens = {answer_tokens}\n")
    ledger = tmp_path / "usage.jsonl"
    server = serve_in_process(
        "--config", str(settings), "--api-key", KEY, "--billing-jsonl", str(ledger), "--drain-timeout-s", str(drain_s),
        "--log-level", log_level,
    )
    return server, ledger


def _billed(ledger: Path) -> dict[str, str]:
    return {r["response_id"]: r["status"] for r in map(json.loads, ledger.read_text().splitlines())}


async def _until(conn: Any, *types: str) -> list[Any]:
    seen = []
    async for event in conn:
        seen.append(event)
        if event.type in types:
            return seen
    raise AssertionError(f"closed before {types}: {[e.type for e in seen]}")


async def _close_code(conn: Any) -> int:
    """Read until the server closes: its close code (events on the way must be none)."""
    events = [event.type async for event in conn]
    assert events == [], events
    code: int = conn._connection.close_code
    return code


def _wait_exit(server: ServeProcess, timeout: float) -> int:
    code = server.proc.wait(timeout)
    return code


def test_sigterm_lets_the_running_turn_finish_then_closes_1001_and_exits_0(tmp_path: Path) -> None:
    # info: the package's own records reach the log too (the drain's count, a line per turn)
    server, ledger = _serve(tmp_path, tokens_per_s=25.0, answer_tokens=40, drain_s=30.0, log_level="info")  # a turn: ~1.6 s
    base = f"http://{server.host}:{server.port}"
    try:
        # No key needed, nothing revealed.
        assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
        assert httpx.get(f"{base}/readyz").json() == {"status": "ready"}

        async def clients() -> tuple[str, str, int, int, float, list[str]]:
            client = AsyncOpenAI(base_url=server.http_url, api_key=KEY, max_retries=0)
            async with client.responses.connect() as busy, client.responses.connect() as idle:
                await idle.response.create(model="sim-1", input="one")
                idle_id = (await _until(idle, "response.completed"))[-1].response.id
                await busy.response.create(model="sim-1", input="two")
                await _until(busy, "response.output_text.delta")  # mid-answer
                server.proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                idle_code = await asyncio.wait_for(_close_code(idle), 5)
                idle_after = time.monotonic() - signalled
                ready = await asyncio.to_thread(httpx.get, f"{base}/readyz")
                assert ready.status_code == 503 and ready.json() == {"status": "unready"}
                # New work goes elsewhere: a new upgrade and an HTTP create get 503 (the SDKs retry it).
                refused = await asyncio.to_thread(
                    httpx.post, f"{server.http_url}/responses", json={"model": "sim-1", "input": "x"},
                    headers={"authorization": f"Bearer {KEY}"},
                )
                assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
                rest = await _until(busy, "response.completed", "response.failed", "response.incomplete")
                assert rest[-1].type == "response.completed"  # the turn finished ...
                busy_code = await asyncio.wait_for(_close_code(busy), 5)  # ... then the close
                return idle_id, rest[-1].response.id, idle_code, busy_code, idle_after, [e.type for e in rest]

        idle_id, busy_id, idle_code, busy_code, idle_after, _ = asyncio.run(clients())
        assert idle_code == 1001 and busy_code == 1001
        assert idle_after < 1.5  # promptly, not after the busy turn
        assert _wait_exit(server, 30) == 0
        assert _billed(ledger) == {idle_id: "completed", busy_id: "completed"}
        log = server.output()
        assert "Traceback" not in log
        assert re.search(r"INFO: draining: [1-9]\d* connection\(s\) and task\(s\) to finish within 30.0s", log), log
        assert f"{busy_id}" in log  # the busy turn's own line
    finally:
        server.kill()


def test_a_turn_past_the_deadline_is_cut_and_billed_and_a_second_signal_is_immediate(tmp_path: Path) -> None:
    # A turn would take 40 s; the deadline is 1 s.
    server, ledger = _serve(tmp_path, tokens_per_s=10.0, answer_tokens=400, drain_s=1.0)
    try:

        async def cut() -> tuple[str, int, str, list[str]]:
            client = AsyncOpenAI(base_url=server.http_url, api_key=KEY, max_retries=0)
            # An SSE stream and a WebSocket turn, both mid-answer when the signal comes.
            stream = await client.responses.create(model="sim-1", input="long too", stream=True)
            sse_events = aiter(stream)
            sse_created = await anext(sse_events)
            assert sse_created.type == "response.created"
            async with client.responses.connect() as conn:
                await conn.response.create(model="sim-1", input="long")
                created = (await _until(conn, "response.created"))[-1].response.id
                server.proc.send_signal(signal.SIGTERM)
                sse_types: list[str] = []
                with contextlib.suppress(httpx.HTTPError, APIError):  # the stream cut: an incomplete body
                    async for event in sse_events:
                        sse_types.append(event.type)
                types = [event.type async for event in conn]
                assert not {"response.completed", "response.failed"} & set(types)
                return created, conn._connection.close_code, sse_created.response.id, sse_types

        signalled = time.monotonic()
        response_id, code, sse_id, sse_types = asyncio.run(cut())
        assert code == 1001
        assert "response.output_text.delta" in sse_types  # it kept streaming until the deadline
        assert not {"response.completed", "response.failed", "response.incomplete"} & set(sse_types)
        assert _wait_exit(server, 20) == 0
        assert time.monotonic() - signalled < 10
        assert _billed(ledger) == {response_id: "cancelled", sse_id: "cancelled"}
    finally:
        server.kill()

    server, ledger = _serve(tmp_path / "second", tokens_per_s=10.0, answer_tokens=400, drain_s=120.0)
    try:

        async def twice() -> str:
            client = AsyncOpenAI(base_url=server.http_url, api_key=KEY, max_retries=0)
            async with client.responses.connect() as conn:
                await conn.response.create(model="sim-1", input="long")
                created: str = (await _until(conn, "response.created"))[-1].response.id
                server.proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.5)
                assert server.proc.poll() is None  # draining: it would wait 120 s
                server.proc.send_signal(signal.SIGTERM)
                async for _ in conn:
                    pass
                return created

        signalled = time.monotonic()
        response_id = asyncio.run(twice())
        assert _wait_exit(server, 20) == 0
        assert time.monotonic() - signalled < 10
        assert _billed(ledger) == {response_id: "cancelled"}
    finally:
        server.kill()
