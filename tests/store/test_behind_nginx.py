"""Issue #36, a real proxy: Debian's nginx, configured as ``docs/deploy.md`` ships it
(``docs/nginx/responses-cache.conf``), in front of two ``responses-cache serve`` processes that
share one Redis, driven by the official SDK: a WebSocket tool loop and an SSE stream through it,
the idle timeout that decides whether an agent's connection survives its thinking time, and a
rolling restart of both processes under agent-style clients that lose no turn, no conversation
and no usage record."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI
from websockets.exceptions import ConnectionClosed

from responses_cache.testing import ServeProcess, free_port, serve_in_process, wait_for
from tests.codex_cli import codex_binary, codex_environment
from tests.store.nginx_proxy import SITE, NginxProcess, nginx_binary

pytestmark = [pytest.mark.subprocess]

KEY = "sk-proxy"
MODEL = "sim-1"
SEALING_KEY = base64.b64encode(bytes(range(32))).decode()
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
    }
]
NGINX = nginx_binary()
needs_nginx = pytest.mark.skipif(
    NGINX is None, reason="no nginx binary (Debian: apt-get install nginx; .ci/run installs it)"
)


@dataclass
class Deployment:
    """Two ``serve`` processes on fixed ports (so a restarted one is the same upstream), sharing a
    Redis store and a sealing key, each writing usage records to a JSONL file per start."""

    tmp: Path
    store: str
    tokens_per_s: float
    ports: tuple[int, int] = field(default_factory=lambda: (free_port(), free_port()))
    processes: list[ServeProcess] = field(default_factory=list)
    ledgers: list[Path] = field(default_factory=list)

    def start(self, index: int, *, wait: bool = True) -> ServeProcess:
        settings = self.tmp / "serve.toml"
        settings.write_text(
            f"[backend_options]\noutput_tokens_per_s = {self.tokens_per_s}\nanswer_tokens = 24\n"
        )
        ledger = self.tmp / f"usage-{index}-{len(self.ledgers)}.jsonl"
        self.ledgers.append(ledger)
        server = serve_in_process(
            "--port",
            str(self.ports[index]),  # the last --port wins: the upstream nginx knows
            "--config",
            str(settings),
            "--api-key",
            KEY,
            "--store",
            self.store,
            "--billing-jsonl",
            str(ledger),
            "--drain-timeout-s",
            "30",
            env={**os.environ, "RESPONSES_CACHE_SEALING_KEY": SEALING_KEY},
            log=self.tmp / f"serve-{index}-{len(self.ledgers)}.log",
            wait=False,
        )
        server.port = self.ports[index]
        if wait:
            server.wait_ready()
        if index < len(self.processes):
            self.processes[index] = server
        else:
            self.processes.append(server)
        return server

    def records(self) -> list[dict[str, Any]]:
        return [
            json.loads(line)
            for path in self.ledgers
            if path.exists()
            for line in path.read_text().splitlines()
        ]

    def stop(self) -> None:
        for server in self.processes:
            server.kill()


@pytest.fixture
def tokens_per_s() -> float:
    """The simulated engine's decode rate (a test parametrizes it to slow its answers down)."""
    return 200.0


@pytest.fixture
def deployment(tmp_path: Path, single_redis_url: str, tokens_per_s: float) -> Iterator[Deployment]:
    if NGINX is None:
        pytest.skip("no nginx binary")
    deployment = Deployment(tmp_path, single_redis_url, tokens_per_s=tokens_per_s)
    try:
        for index in (0, 1):
            deployment.start(index, wait=False)
        for server in deployment.processes:
            server.wait_ready()
        yield deployment
    finally:
        deployment.stop()


@pytest.fixture
def nginx(tmp_path: Path, deployment: Deployment) -> Iterator[NginxProcess]:
    assert NGINX is not None
    with NginxProcess(NGINX, tmp_path / "nginx", deployment.ports) as proxy:
        yield proxy


def _code(event: Any) -> str | None:
    dumped: dict[str, Any] = event.model_dump()
    error = dumped.get("error") or {}
    code = error.get("code") if isinstance(error, dict) else None
    found = code or dumped.get("code")
    return str(found) if found is not None else None


async def _terminal(conn: Any) -> Any | None:
    """The turn's final ``response`` (a failure raises); None when the connection went away
    before it (closed, or the drain's ``websocket_connection_limit_reached``)."""
    try:
        async for event in conn:
            if event.type == "response.completed":
                return event.response
            if event.type in ("response.failed", "response.incomplete"):
                raise AssertionError(f"turn ended {event.type}: {event.model_dump()}")
            if event.type == "error":
                if _code(event) == "websocket_connection_limit_reached":
                    return None
                raise AssertionError(f"error event: {event.model_dump()}")
    except ConnectionClosed:
        return None
    return None


@dataclass
class Agent:
    """A coding agent over WebSocket mode: each user turn asks for a command, gets the call,
    sends the command's output, gets the answer; ``store: true``, chained by
    ``previous_response_id``. On a close it reconnects once and sends the same turn again."""

    client: AsyncOpenAI
    name: str
    completed: list[str] = field(default_factory=list)
    reconnects: int = 0
    previous: str | None = None
    turns: int = 0

    async def turn(self, conn: Any, input: Any) -> tuple[Any, Any]:
        for attempt in (0, 1):
            response = None
            try:
                await conn.response.create(
                    model=MODEL,
                    input=input,
                    tools=TOOLS,
                    store=True,
                    previous_response_id=self.previous,
                )
                response = await _terminal(conn)
            except ConnectionClosed:
                pass
            if response is not None:
                self.completed.append(response.id)
                self.previous = response.id
                return conn, response
            assert attempt == 0, f"{self.name}: the turn failed again after its one reconnect"
            self.reconnects += 1
            await conn.close()
            conn = await self.client.responses.connect().enter()
        raise AssertionError("unreachable")

    async def run(self, stop: asyncio.Event, min_turns: int) -> None:
        conn = await self.client.responses.connect().enter()
        try:
            while self.turns < min_turns or not stop.is_set():
                user = [
                    {
                        "role": "user",
                        "content": f"{self.name} turn {self.turns}: run `ls -{self.turns}`",
                    }
                ]
                conn, called = await self.turn(conn, user)
                call = next(item for item in called.output if item.type == "function_call")
                output = [
                    {
                        "type": "function_call_output",
                        "call_id": call.call_id,
                        "output": f"file{self.turns}\n",
                    }
                ]
                conn, answered = await self.turn(conn, output)
                assert f"file{self.turns}" in answered.output_text
                self.turns += 1
                await asyncio.sleep(0.02)  # thinking
        finally:
            await conn.close()


@needs_nginx
def test_the_documented_config_is_the_one_tested() -> None:
    deploy = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```nginx\n(.*?)```", deploy, re.S)
    assert SITE.read_text() in blocks


@needs_nginx
def test_a_websocket_tool_loop_through_nginx(nginx: NginxProcess, deployment: Deployment) -> None:
    async def tool_loop() -> Agent:
        agent = Agent(AsyncOpenAI(base_url=f"{nginx.url}/v1", api_key=KEY, max_retries=0), "solo")
        stop = asyncio.Event()
        stop.set()
        await agent.run(stop, min_turns=3)
        return agent

    agent = asyncio.run(tool_loop())
    assert agent.turns == 3 and agent.reconnects == 0 and len(agent.completed) == 6
    # Round robin put the new connection's turns on one process; the conversation is in Redis,
    # so a plain HTTP request (on either) continues it.
    client = OpenAI(base_url=f"{nginx.url}/v1", api_key=KEY, max_retries=0)
    for _ in range(2):
        after = client.responses.create(
            model=MODEL, input="and now?", previous_response_id=agent.previous
        )
        assert after.status == "completed"
    wait_for(lambda: len(deployment.records()) == 8, "a usage record for each of the 8 turns")


@needs_nginx
@pytest.mark.parametrize("tokens_per_s", [20.0])
def test_an_sse_stream_through_nginx_arrives_as_it_is_written(
    nginx: NginxProcess, deployment: Deployment
) -> None:
    client = OpenAI(base_url=f"{nginx.url}/v1", api_key=KEY, max_retries=0)
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
    tmp_path: Path, nginx: NginxProcess, deployment: Deployment
) -> None:
    """The shipped 3600 s keeps a connection idle between turns; 2 s (standing in for nginx's
    default 60 s, which CI cannot wait out) cuts it after 2 s of silence."""
    assert NGINX is not None
    with NginxProcess(NGINX, tmp_path / "short", deployment.ports, read_timeout_s=2) as short:

        async def idle_then_turn(url: str) -> str | None:
            client = AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
            conn = await client.responses.connect().enter()
            try:
                await conn.response.create(model=MODEL, input="first", store=True)
                first = await _terminal(conn)
                assert first is not None
                await asyncio.sleep(3.0)  # the agent thinks
                try:
                    await conn.response.create(
                        model=MODEL, input="second", previous_response_id=first.id
                    )
                except ConnectionClosed:
                    return None
                second = await _terminal(conn)
                return None if second is None else str(second.id)
            finally:
                await conn.close()

        async def both() -> tuple[str | None, str | None]:
            return await asyncio.gather(idle_then_turn(nginx.url), idle_then_turn(short.url))

        survived, cut = asyncio.run(both())
    assert survived is not None
    assert cut is None


@needs_nginx
@pytest.mark.timeout(90)
def test_a_rolling_restart_behind_nginx_loses_no_turn_conversation_or_record(
    nginx: NginxProcess, deployment: Deployment
) -> None:
    async def scenario() -> list[Agent]:
        client = AsyncOpenAI(base_url=f"{nginx.url}/v1", api_key=KEY, max_retries=2)
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
    records = deployment.records()
    ids = [record["response_id"] for record in records]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(completed)
    assert {record["status"] for record in records} == {"completed"}
    # No conversation lost: each agent's last response still holds its first turn (a store read
    # on a fresh process, through nginx).
    restarted = [deployment.start(0, wait=False), deployment.start(1, wait=False)]
    for server in restarted:
        server.wait_ready()
    client = OpenAI(base_url=f"{nginx.url}/v1", api_key=KEY)
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
    tmp_path: Path, nginx: NginxProcess, deployment: Deployment
) -> None:
    """The real Codex CLI through nginx: while it runs the task's command (its WebSocket idle
    between the call and the command's output), both processes are restarted one after the
    other. The process holding Codex's connection closes it with 1001; Codex opens a new one
    through nginx, lands on a process that never saw the conversation, and finishes the task
    there (the conversation is in the shared store) — over WebSocket still, no turn failed,
    one usage record per response."""
    binary = codex_binary()
    marker = "hello-from-a-restart"
    command = f"sleep 6; echo {marker}"
    codex = _start_codex(binary, f"{nginx.url}/v1", tmp_path, f"Run `{command}` and tell me the output.")
    try:
        wait_for(lambda: _running(command), "Codex running the task's command", timeout=60)
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
    records = deployment.records()
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


def _start_codex(binary: Path, base_url: str, tmp_path: Path, task: str) -> subprocess.Popen[str]:
    """``codex exec`` of ``task`` in the background (the same configuration as
    :func:`tests.codex_cli.codex_exec`), with the proxy's API key."""
    argv, cwd, env = codex_environment(binary, base_url, tmp_path, task=task, api_key=KEY)
    return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _running(command: str) -> bool:
    """A process on this machine is running ``command`` (Codex runs it under a shell)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if command in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                return True
        except OSError:
            continue
    return False
