"""Issue #36, a real proxy: Debian's nginx and HAProxy, each configured as ``docs/deploy.md``
ships it (``docs/nginx/responses-cache.conf``, ``docs/haproxy/responses-cache.cfg``), in front of
two ``responses-cache serve`` processes that share one Redis, driven by the official SDK: a
WebSocket tool loop and an SSE stream through it, and a rolling restart of both processes under
agent-style clients that lose no turn, no conversation and no usage record; through nginx also
the idle timeout that decides whether an agent's connection survives its thinking time, and the
real Codex CLI through a rolling restart."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI, OpenAI
from websockets.exceptions import ConnectionClosed

from benchmarks.suite.proxyproc import (
    HAPROXY_CONFIG,
    SITE,
    HAProxyProcess,
    NginxProcess,
    ProxyProcess,
    binary,
)
from responses_cache.testing import wait_for
from tests.codex_cli import codex_binary, running, start_codex
from tests.store.deployment import MODEL, Agent, Deployment, terminal

pytestmark = [pytest.mark.subprocess]

NGINX = binary("nginx")
HAPROXY = binary("haproxy")
needs_nginx = pytest.mark.skipif(
    NGINX is None, reason="no nginx binary (Debian: apt-get install nginx; .ci/run installs it)"
)
needs_haproxy = pytest.mark.skipif(
    HAPROXY is None, reason="no haproxy binary (Debian: apt-get install haproxy; .ci/run installs it)"
)


@pytest.fixture
def nginx(tmp_path: Path, deployment: Deployment) -> Iterator[NginxProcess]:
    assert NGINX is not None
    with NginxProcess(NGINX, tmp_path / "nginx", deployment.ports) as proxy:
        yield proxy


@pytest.fixture(params=[pytest.param("nginx", marks=needs_nginx), pytest.param("haproxy", marks=needs_haproxy)])
def proxy(request: pytest.FixtureRequest, tmp_path: Path, deployment: Deployment) -> Iterator[ProxyProcess]:
    """Each proxy, as shipped, in front of the deployment's two processes."""
    started: ProxyProcess
    if request.param == "nginx":
        assert NGINX is not None
        started = NginxProcess(NGINX, tmp_path / "nginx", deployment.ports)
    else:
        assert HAPROXY is not None
        started = HAProxyProcess(HAPROXY, tmp_path / "haproxy", deployment.ports)
    with started:
        yield started


@pytest.mark.parametrize(("language", "config"), [("nginx", SITE), ("haproxy", HAPROXY_CONFIG)])
def test_the_documented_config_is_the_one_tested(language: str, config: Path) -> None:
    deploy = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    blocks = re.findall(rf"```{language}\n(.*?)```", deploy, re.S)
    assert config.read_text() in blocks


def test_a_websocket_tool_loop_through_a_proxy(proxy: ProxyProcess, deployment: Deployment, tenant_key: str) -> None:
    async def tool_loop() -> Agent:
        agent = Agent(AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key=tenant_key, max_retries=0), "solo")
        stop = asyncio.Event()
        stop.set()
        await agent.run(stop, min_turns=3)
        return agent

    agent = asyncio.run(tool_loop())
    assert agent.turns == 3 and agent.reconnects == 0 and len(agent.completed) == 6
    # Round robin put the new connection's turns on one process; the conversation is in Redis,
    # so a plain HTTP request (on either) continues it.
    client = OpenAI(base_url=f"{proxy.url}/v1", api_key=tenant_key, max_retries=0)
    for _ in range(2):
        after = client.responses.create(
            model=MODEL, input="and now?", previous_response_id=agent.previous
        )
        assert after.status == "completed"
    wait_for(lambda: len(deployment.records(tenant_key)) == 8, "a usage record for each of the 8 turns")


@pytest.mark.parametrize("tokens_per_s", [20.0])
def test_an_sse_stream_through_a_proxy_arrives_as_it_is_written(proxy: ProxyProcess, tenant_key: str) -> None:
    client = OpenAI(base_url=f"{proxy.url}/v1", api_key=tenant_key, max_retries=0)
    arrivals: list[float] = []
    with client.responses.stream(model=MODEL, input="stream me") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                arrivals.append(time.monotonic())
        final = stream.get_final_response()
    assert final.status == "completed" and len(arrivals) >= 10
    # 24 tokens at 20/s: the deltas reach the client spread over the answer's decode (buffering
    # off), not in one burst at its end.
    assert arrivals[-1] - arrivals[0] > 0.3, arrivals


@needs_nginx
def test_proxy_read_timeout_decides_whether_an_idle_agent_survives(
    tmp_path: Path, nginx: NginxProcess, deployment: Deployment, tenant_key: str
) -> None:
    """The shipped 3600 s keeps a connection idle between turns; 2 s (standing in for nginx's
    default 60 s, which CI cannot wait out) cuts it after 2 s of silence."""
    assert NGINX is not None
    with NginxProcess(NGINX, tmp_path / "short", deployment.ports, read_timeout_s=2) as short:

        async def idle_then_turn(url: str) -> str | None:
            client = AsyncOpenAI(base_url=f"{url}/v1", api_key=tenant_key, max_retries=0)
            conn = await client.responses.connect().enter()
            try:
                await conn.response.create(model=MODEL, input="first", store=True)
                first = await terminal(conn)
                assert first is not None
                await asyncio.sleep(3.0)  # the agent thinks
                try:
                    await conn.response.create(
                        model=MODEL, input="second", previous_response_id=first.id
                    )
                except ConnectionClosed:
                    return None
                second = await terminal(conn)
                return None if second is None else str(second.id)
            finally:
                await conn.close()

        async def both() -> tuple[str | None, str | None]:
            return await asyncio.gather(idle_then_turn(nginx.url), idle_then_turn(short.url))

        survived, cut = asyncio.run(both())
    assert survived is not None
    assert cut is None


@pytest.mark.timeout(90)
def test_a_rolling_restart_behind_a_proxy_loses_no_turn_conversation_or_record(
    proxy: ProxyProcess, deployment: Deployment, tenant_key: str
) -> None:
    async def scenario() -> list[Agent]:
        client = AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key=tenant_key, max_retries=2)
        agents = [Agent(client, f"agent{i}") for i in range(4)]
        stop = asyncio.Event()
        runs = asyncio.gather(*(agent.run(stop, min_turns=2) for agent in agents))

        async def until_each_did(more: int) -> None:
            targets = [agent.turns + more for agent in agents]
            deadline = time.monotonic() + 30
            while any(agent.turns < target for agent, target in zip(agents, targets, strict=True)):
                assert time.monotonic() < deadline, "agents stalled"
                await asyncio.sleep(0.02)

        try:
            for index in (0, 1):
                await until_each_did(2)  # every agent mid-conversation
                old = deployment.processes[index]
                old.proc.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(old.proc.wait, 40) == 0
                assert "Traceback" not in old.output()
                await until_each_did(2)  # on the other process meanwhile
                await asyncio.to_thread(deployment.start, index)
                await asyncio.sleep(proxy.settle_s)  # the proxy's health check sees it ready
            await until_each_did(1)
        finally:
            stop.set()
            await runs
        return agents

    agents = asyncio.run(scenario())
    assert all(agent.reconnects >= 1 for agent in agents), [a.reconnects for a in agents]
    completed = [rid for agent in agents for rid in agent.completed]
    assert len(completed) == len(set(completed))
    # Usage: one record per completed turn, none doubled, none missing, none for a turn not run.
    for server in deployment.processes:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(40) == 0
    records = deployment.records(tenant_key)
    ids = [record["response_id"] for record in records]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(completed)
    assert {record["status"] for record in records} == {"completed"}
    # No conversation lost: each agent's last response still holds its first turn (a store read
    # on a fresh process, through the proxy).
    restarted = [deployment.start(0, wait=False), deployment.start(1, wait=False)]
    for server in restarted:
        server.wait_ready()
    client = OpenAI(base_url=f"{proxy.url}/v1", api_key=tenant_key)
    for agent in agents:
        assert agent.previous is not None
        items = list(client.responses.input_items.list(agent.previous, order="asc", limit=100))
        assert f"{agent.name} turn 0" in json.dumps(items[0].model_dump())
        assert len(items) == 4 * agent.turns - 1


@needs_nginx
@pytest.mark.npm
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_codex_cli_finishes_its_task_through_a_rolling_restart(
    tmp_path: Path, nginx: NginxProcess, deployment: Deployment, tenant_key: str
) -> None:
    """The real Codex CLI through nginx: while it runs the task's command (its WebSocket idle
    between the call and the command's output), both processes are restarted one after the
    other. The process holding Codex's connection closes it with 1001; Codex opens a new one
    through nginx, lands on a process that never saw the conversation, and finishes the task
    there (the conversation is in the shared store) — over WebSocket still, no turn failed,
    one usage record per response."""
    cli = codex_binary()
    marker = "hello-from-a-restart"
    command = f"sleep 6; echo {marker}"
    codex = start_codex(cli, f"{nginx.url}/v1", tmp_path, f"Run `{command}` and tell me the output.", api_key=tenant_key)
    try:
        wait_for(lambda: running(command), "Codex running the task's command", timeout=60)
        for index in (0, 1):
            old = deployment.processes[index]
            old.proc.send_signal(signal.SIGTERM)
            assert old.proc.wait(20) == 0
            assert "Traceback" not in old.output()
            deployment.start(index)
        out, err = codex.communicate(timeout=90)
    finally:
        if codex.poll() is None:
            codex.kill()
            codex.communicate()
    assert codex.returncode == 0, err[-3000:]
    assert marker in out
    assert "Falling back" not in err  # it stayed on WebSocket mode
    for server in deployment.processes:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(40) == 0
    records = deployment.records(tenant_key)
    ids = [record["response_id"] for record in records]
    assert len(ids) == len(set(ids)) and len(ids) >= 3, records  # warm-up, call, answer
    assert {record["status"] for record in records} == {"completed"}
    assert {record["transport"] for record in records} == {"websocket"}
    # What Codex does on the new connection (docs/deploy.md): it resends the whole conversation,
    # without previous_response_id (it chains with it only on the connection that made the parent).
    answer = max(records, key=lambda record: record["finished_at"])
    call = max((r for r in records if r is not answer), key=lambda record: record["finished_at"])
    assert call["previous_response_id"] is not None
    assert answer["previous_response_id"] is None
    assert answer["input_tokens"] > call["input_tokens"] + call["output_tokens"]
