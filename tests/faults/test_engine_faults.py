"""Issue #36, faults on the way to the engine: a real ``responses-cache serve --backend vllm``
whose two engine replicas (the HTTP fake vLLM, real uvicorn) are each reached through a
:class:`~tests.faultproxy.FaultProxy`, driven by the official SDK over WebSocket mode and HTTP
streaming. The connection to the engine stalls, is reset or is refused; what the client sees is a
clear error with the status and code the docs give (``response.failed`` / ``server_error`` once
the engine accepted the turn, an ``error`` 502 ``server_error`` before), or nothing at all when
another replica takes the turn; a stall ends at the adapter's ``timeout``; the connection and the
conversation go on after healing; every response is billed exactly once."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from responses_cache import get_renderer
from responses_cache.testing import (
    Behaviour,
    FakeVllm,
    LiveServer,
    ServeProcess,
    serve_in_process,
    serve_in_thread,
)
from tests.faultproxy import FaultProxy

pytestmark = [pytest.mark.subprocess]

KEY = "sk-faults"
MODEL = "gpt-oss"
#: The adapter's read timeout (backend option ``timeout``): how long a stalled engine is waited for.
ENGINE_TIMEOUT_S = 1.5
ENC = get_renderer("harmony").encoding
ANSWER = "<|channel|>final<|message|>" + " ".join(f"word{i}" for i in range(40)) + "<|return|>"
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")


@dataclass
class Engines:
    """Two fake vLLM replicas, each behind its own fault proxy, and one ``serve`` over both."""

    fakes: list[FakeVllm]
    proxies: list[FaultProxy]
    live: list[LiveServer]
    server: ServeProcess
    ledger: Path
    #: Every response id a client saw (completed or failed): each must be billed once.
    seen: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.http_url

    def generations(self) -> list[int]:
        return [len(fake.generation_requests()) for fake in self.fakes]

    def mid_answer(self) -> threading.Semaphore:
        """The next generation (on whichever replica takes it) holds after four chunks until
        the returned gate is released."""
        gate = threading.Semaphore(0)
        for fake in self.fakes:
            fake.behaviours = [Behaviour(chunk_tokens=1, hang_after=4, gate=gate)]
        return gate

    def records(self) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        return [json.loads(line) for line in self.ledger.read_text().splitlines()]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    tmp = tmp_path_factory.mktemp("engine-faults")
    fakes = [FakeVllm(ENC, [ANSWER]) for _ in range(2)]
    live = [serve_in_thread(fake.app()) for fake in fakes]
    proxies = [FaultProxy(server.port).start() for server in live]
    settings = tmp / "serve.toml"
    urls = ", ".join(f'"{proxy.url}"' for proxy in proxies)
    settings.write_text(
        "[backend_options]\n"
        f"base_urls = [{urls}]\n"
        'model = "openai/gpt-oss-20b"\nserved_models = ["gpt-oss"]\ntemplate = "harmony"\n'
        f"timeout = {ENGINE_TIMEOUT_S}\nconnect_timeout = 1.0\ncooldown = 0.5\n"
    )
    ledger = tmp / "usage.jsonl"
    server = serve_in_process(
        "--backend", "vllm", "--renderer", "harmony", "--config", str(settings), "--api-key", KEY,
        "--billing-jsonl", str(ledger), log=tmp / "serve.log",
    )
    engines = Engines(fakes, proxies, live, server, ledger)
    try:
        yield engines
        # Billing exactly once over the whole module: one record per response a client saw.
        server.stop()
        ids = [record["response_id"] for record in engines.records()]
        assert sorted(ids) == sorted(engines.seen), (ids, engines.seen)
        assert "Traceback" not in server.output()
    finally:
        server.kill()
        for proxy in proxies:
            proxy.stop()
        for item in live:
            item.stop()


@pytest.fixture
def engines(deployment: Engines) -> Iterator[Engines]:
    yield deployment
    for proxy in deployment.proxies:
        proxy.heal()
    for fake in deployment.fakes:
        fake.behaviours = []


def _code(event: Any) -> str | None:
    dumped: dict[str, Any] = event.model_dump()
    error = dumped.get("error") or {}
    return (error.get("code") if isinstance(error, dict) else None) or dumped.get("code")


async def _ws_turn(
    engines: Engines, conn: Any, previous: str | None, on_delta: Callable[[], None] | None = None
) -> tuple[Any, float]:
    """One turn on an open connection: its terminal event, and the seconds from the first delta
    (the fault) to it. ``on_delta`` runs once, at the first output delta."""
    await conn.response.create(model=MODEL, input="Say forty words.", store=True, previous_response_id=previous)
    faulted = time.monotonic()
    async for event in conn:
        if event.type == "response.output_text.delta" and on_delta is not None:
            on_delta()
            on_delta, faulted = None, time.monotonic()
        if event.type in TERMINAL:
            if event.type != "error":
                engines.seen.append(event.response.id)
            return event, time.monotonic() - faulted
    raise AssertionError("the connection ended without a terminal event")


def _fault_mid_answer(engines: Engines, fault: str) -> None:
    """A WebSocket conversation: a turn, a turn the fault hits mid-answer, healing, a turn that
    continues from the first."""
    gate_holder: list[threading.Semaphore] = []

    def inject() -> None:
        for proxy in engines.proxies:
            getattr(proxy, fault)()
        gate_holder[0].release(1000)  # the engine goes on writing (into the fault)

    async def scenario() -> None:
        client = AsyncOpenAI(base_url=engines.url, api_key=KEY, max_retries=0)
        async with client.responses.connect() as conn:
            first, _ = await _ws_turn(engines, conn, None)
            assert first.type == "response.completed"
            gate_holder.append(engines.mid_answer())
            failed, waited = await _ws_turn(engines, conn, first.response.id, inject)
            assert failed.type == "response.failed", failed
            assert failed.response.error.code == "server_error"
            assert "engine" in failed.response.error.message
            if fault == "stall":  # ended by the adapter's timeout, not before, not much later
                assert ENGINE_TIMEOUT_S - 0.2 < waited < ENGINE_TIMEOUT_S + 3.0, waited
            else:
                assert waited < ENGINE_TIMEOUT_S, waited
            for proxy in engines.proxies:
                proxy.heal()
            engines.mid_answer().release(1000)  # the behaviour queued for the idle replica goes
            for fake in engines.fakes:
                fake.behaviours = []
            # The same connection, the conversation continued from its last completed turn.
            after, _ = await _ws_turn(engines, conn, first.response.id)
            assert after.type == "response.completed", after
            assert after.response.previous_response_id == first.response.id

    asyncio.run(asyncio.wait_for(scenario(), 20))


def test_a_stalled_engine_fails_the_turn_at_the_adapter_timeout(engines: Engines) -> None:
    _fault_mid_answer(engines, "stall")


def test_a_reset_engine_connection_fails_the_turn_at_once(engines: Engines) -> None:
    _fault_mid_answer(engines, "reset")


def test_a_refused_engine_is_a_502_before_the_turn_then_the_connection_goes_on(engines: Engines) -> None:
    async def scenario() -> None:
        client = AsyncOpenAI(base_url=engines.url, api_key=KEY, max_retries=0)
        async with client.responses.connect() as conn:
            first, _ = await _ws_turn(engines, conn, None)
            assert first.type == "response.completed"
            for proxy in engines.proxies:
                proxy.refuse()
            refused, _ = await _ws_turn(engines, conn, first.response.id)
            assert refused.type == "error", refused
            dumped = refused.model_dump()
            assert dumped["status"] == 502 and _code(refused) == "server_error", dumped
            for proxy in engines.proxies:
                proxy.heal()
            after, _ = await _ws_turn(engines, conn, first.response.id)
            assert after.type == "response.completed", after

    asyncio.run(asyncio.wait_for(scenario(), 20))


def test_http_streaming_sees_the_same_faults(engines: Engines) -> None:
    """HTTP: a refused engine is a 502 the SDK retries (here ``max_retries=0``: the error shows);
    a reset mid-stream is ``response.failed`` in the stream; healed, the conversation goes on."""
    client = OpenAI(base_url=engines.url, api_key=KEY, max_retries=0)
    first = client.responses.create(model=MODEL, input="Say forty words.", store=True)
    engines.seen.append(first.id)
    for proxy in engines.proxies:
        proxy.refuse()
    with pytest.raises(openai.InternalServerError) as refused:
        client.responses.create(model=MODEL, input="again", previous_response_id=first.id)
    assert refused.value.status_code == 502
    for proxy in engines.proxies:
        proxy.heal()
    gate = engines.mid_answer()
    failed: Any = None
    with client.responses.stream(model=MODEL, input="more", previous_response_id=first.id) as stream:
        for event in stream:
            if event.type == "response.output_text.delta" and gate is not None:
                for proxy in engines.proxies:
                    proxy.reset()
                gate.release(1000)
                gate = None  # type: ignore[assignment]
            if event.type in TERMINAL:
                failed = event
                break
    assert failed is not None and failed.type == "response.failed", failed
    assert failed.response.error.code == "server_error"
    engines.seen.append(failed.response.id)
    engines.mid_answer().release(1000)
    for fake in engines.fakes:
        fake.behaviours = []
    retried = openai.OpenAI(base_url=engines.url, api_key=KEY, max_retries=2)
    after = retried.responses.create(model=MODEL, input="and now?", previous_response_id=first.id)
    assert after.status == "completed"
    engines.seen.append(after.id)


def test_a_refused_replica_goes_unnoticed(engines: Engines) -> None:
    """The replica that served a conversation refuses: its next turn runs on the other one, with
    its whole context, and the client sees nothing."""

    async def scenario() -> None:
        client = AsyncOpenAI(base_url=engines.url, api_key=KEY, max_retries=0)
        async with client.responses.connect() as conn:
            before = engines.generations()
            first, _ = await _ws_turn(engines, conn, None)
            assert first.type == "response.completed"
            owner = next(i for i, (a, b) in enumerate(zip(before, engines.generations(), strict=True)) if b > a)
            engines.proxies[owner].refuse()
            before = engines.generations()
            second, _ = await _ws_turn(engines, conn, first.response.id)
            assert second.type == "response.completed", second
            moved = [b - a for a, b in zip(before, engines.generations(), strict=True)]
            assert moved[owner] == 0 and moved[1 - owner] == 1
            prompt = engines.fakes[1 - owner].generation_requests()[-1].body["token_ids"]
            assert "word39" in ENC.decode(prompt)  # the first answer came along

    asyncio.run(asyncio.wait_for(scenario(), 20))
