"""Redis failover under agent load (issue #36): ``responses-cache serve`` processes sharing a
Sentinel-managed Redis (a primary, a replica, one Sentinel set to fail over fast), agent-style
clients of the official SDK (every other one over WebSocket mode, the others over HTTP, where
each continuation is read from the store; ``store: true``, chained by ``previous_response_id``), and the primary killed with ``SIGKILL`` mid-load; the Sentinel
promotes the replica.

What a run reports (:class:`FailoverReport`): the time the Sentinel took to name the new primary,
the time until every client had a turn succeed again after its last failure, each failed turn's
code, the responses that completed before the kill and cannot be read back from the store
afterwards (goal 0), the responses that completed but were not stored (a write that failed during
the failover), and the usage records missing or doubled (goal 0).

A client retries a failed turn (same input, same ``previous_response_id``) after a short pause,
reconnecting if the connection closed: the run measures what that costs, not whether it happens.

    python -m benchmarks.suite.failover --agents 8 --turns-after 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .deployment import MODEL, Deployment
from .redisproc import SentinelProcess

KEY = "sk-failover"


@dataclass
class Failure:
    """One failed try of a turn, as the client saw it."""

    agent: str
    at_s: float  # seconds after the kill (negative: before it)
    kind: str  # "error" (an error event), "failed" (response.failed), "closed" (the connection)
    code: str | None
    status: int | None


@dataclass
class FailoverReport:
    agents: int
    turns_completed: int
    #: Seconds from the kill until the Sentinel named the replica as primary.
    promoted_after_s: float
    #: Whether the Sentinel had already moved the primary before the kill (a spurious failover
    #: under load: ``down_after_ms`` too short for the machine).
    moved_before_kill: bool
    #: Seconds from the kill until the last failed try (0.0: no client noticed).
    recovered_after_s: float
    failures: list[Failure] = field(default_factory=list)
    #: Responses completed before the kill that the store cannot give back afterwards.
    lost_before_kill: list[str] = field(default_factory=list)
    #: Responses completed after the kill that the store cannot give back (a write that failed).
    unstored_after_kill: list[str] = field(default_factory=list)
    #: Why a read-back failed (exception type and HTTP status), counted.
    read_errors: dict[str, int] = field(default_factory=dict)
    records_missing: list[str] = field(default_factory=list)
    records_doubled: list[str] = field(default_factory=list)
    #: Records of responses no client saw complete, by status (failed turns are billed).
    records_other: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        codes: dict[str, int] = {}
        for failure in self.failures:
            name = f"{failure.kind}:{failure.code}"
            codes[name] = codes.get(name, 0) + 1
        out = asdict(self)
        out["failures"] = codes
        return out


@dataclass
class _Agent:
    client: Any
    name: str
    clock: _Clock
    completed: list[tuple[str, float]] = field(default_factory=list)  # (id, when) per completed turn
    failures: list[Failure] = field(default_factory=list)
    previous: str | None = None
    #: Turns over HTTP (``responses.create``) instead of a WebSocket connection.
    http: bool = False

    async def run(self, stop: asyncio.Event, give_up_s: float = 30.0) -> None:
        """Turns until ``stop``; a turn still failing ``give_up_s`` after its first try raises."""
        if self.http:
            await self._run_http(stop, give_up_s)
        else:
            await self._run_ws(stop, give_up_s)

    def _tries(self, give_up_s: float) -> Iterator[int]:
        deadline = time.monotonic() + give_up_s
        tries = 0
        while time.monotonic() < deadline:
            yield tries
            tries += 1
        raise RuntimeError(f"{self.name}: a turn failed for {give_up_s} s: {self.failures[-3:]}")

    async def _run_http(self, stop: asyncio.Event, give_up_s: float) -> None:
        """The same loop over HTTP: each continuation is read from the store."""
        import openai

        turn = 0
        while not stop.is_set():
            text = f"{self.name} turn {turn}: run `ls -{turn}`"
            for _ in self._tries(give_up_s):
                try:
                    response = await self.client.responses.create(
                        model=MODEL, input=text, store=True, previous_response_id=self.previous
                    )
                except openai.APIStatusError as exc:
                    body = exc.body if isinstance(exc.body, dict) else {}
                    error = body.get("error", body) if isinstance(body, dict) else {}
                    code = error.get("code") if isinstance(error, dict) else None
                    self.failures.append(Failure(self.name, self.clock.now(), "error", code, exc.status_code))
                    await asyncio.sleep(0.05)
                    continue
                self.previous = response.id
                self.completed.append((response.id, self.clock.now()))
                break
            turn += 1
            await asyncio.sleep(0.01)

    async def _run_ws(self, stop: asyncio.Event, give_up_s: float) -> None:
        from websockets.exceptions import ConnectionClosed

        conn = await self.client.responses.connect().enter()
        try:
            turn = 0
            while not stop.is_set():
                text = f"{self.name} turn {turn}: run `ls -{turn}`"
                for _ in self._tries(give_up_s):
                    try:
                        await conn.response.create(
                            model=MODEL, input=text, store=True, previous_response_id=self.previous
                        )
                        event = await _terminal(conn)
                    except ConnectionClosed:
                        event = None
                    if event is not None and event.type == "response.completed":
                        self.previous = event.response.id
                        self.completed.append((event.response.id, self.clock.now()))
                        break
                    self.failures.append(self._failure(event))
                    if event is None:
                        await conn.close()
                        conn = await self.client.responses.connect().enter()
                    await asyncio.sleep(0.05)
                turn += 1
                await asyncio.sleep(0.01)  # thinking
        finally:
            await conn.close()

    def _failure(self, event: Any) -> Failure:
        return failure_of(self.name, self.clock.now(), event)


def failure_of(agent: str, at_s: float, event: Any | None) -> Failure:
    """The :class:`Failure` a turn's last event (``error``, ``response.failed`` or
    ``.incomplete``; None: the connection closed before one) stands for."""
    if event is None:
        return Failure(agent, at_s, "closed", None, None)
    dumped: dict[str, Any] = event.model_dump()
    if event.type == "error":
        error = dumped.get("error") or {}
        return Failure(agent, at_s, "error", error.get("code"), dumped.get("status"))
    error = (dumped.get("response") or {}).get("error") or {}
    return Failure(agent, at_s, "failed", error.get("code"), None)


async def _terminal(conn: Any) -> Any | None:
    async for event in conn:
        if event.type in ("response.completed", "response.failed", "response.incomplete", "error"):
            return event
    return None


class _Clock:
    """Seconds since the kill; ``-inf`` before it (``zero`` is set at the kill)."""

    def __init__(self) -> None:
        self.zero = math.inf

    def now(self) -> float:
        return time.monotonic() - self.zero


def run(
    *, agents: int = 4, processes: int = 2, turns_before: int = 2, turns_after: int = 3,
    tokens_per_s: float = 400.0, down_after_ms: int = 200, failover_timeout_ms: int = 2000,
    work_dir: Path | None = None, timeout_s: float = 60.0,
) -> FailoverReport:
    """One failover run (see the module's docstring); every process it starts is stopped."""
    from openai import AsyncOpenAI, OpenAI

    tmp = Path(work_dir or tempfile.mkdtemp(prefix="responses-cache-failover-"))
    with SentinelProcess(replicas=1, down_after_ms=down_after_ms, failover_timeout_ms=failover_timeout_ms) as redis:
        deployment = Deployment(tmp, redis.url, tokens_per_s, count=processes, key=KEY, answer_tokens=12)
        servers = deployment.processes
        try:
            deployment.start_all()
            clock = _Clock()
            crowd = [
                _Agent(AsyncOpenAI(base_url=servers[i % processes].http_url, api_key=KEY, max_retries=0), f"agent{i}", clock,
                       http=i % 2 == 1)
                for i in range(agents)
            ]
            promoted: list[float] = []
            moved: list[bool] = []

            def watch(killed_at: float, killed_port: int) -> None:
                if redis.wait_promoted(killed_port, killed_at + timeout_s - time.monotonic()):
                    promoted.append(time.monotonic() - killed_at)

            async def scenario() -> list[str]:
                stop = asyncio.Event()
                runs = asyncio.gather(*(agent.run(stop) for agent in crowd))

                async def until_each(count: int, after: float | None = None) -> None:
                    """Until every agent completed ``count`` turns (after ``after`` s past the kill)."""
                    deadline = time.monotonic() + timeout_s
                    while any(
                        sum(1 for _, at in agent.completed if after is None or at > after) < count
                        for agent in crowd
                    ):
                        if runs.done():
                            runs.result()  # an agent gave up: its error
                        if time.monotonic() > deadline:
                            raise RuntimeError("the agents stalled")
                        await asyncio.sleep(0.01)

                try:
                    await until_each(turns_before)
                    before = [rid for agent in crowd for rid, _ in agent.completed]
                    moved.append(redis.primary_port() != redis.server.port)
                    primary = redis.kill_primary()
                    clock.zero = killed = time.monotonic()
                    watcher = threading.Thread(target=watch, args=(killed, primary), daemon=True)
                    watcher.start()
                    await until_each(1, after=0.0)
                    await asyncio.to_thread(watcher.join)
                    await until_each(turns_after, after=promoted[0] if promoted else 0.0)
                finally:
                    stop.set()
                    await runs
                return before

            before = asyncio.run(asyncio.wait_for(scenario(), timeout_s * 3))
            # Read every completed response back from the store, on a process that has no
            # connection cache for it (HTTP, the other process than the one that served it).
            readers = [OpenAI(base_url=server.http_url, api_key=KEY, max_retries=2) for server in servers]
            lost: list[str] = []
            unstored: list[str] = []
            read_errors: dict[str, int] = {}
            for index, agent in enumerate(crowd):
                reader = readers[(index + 1) % processes]
                for rid, _at in agent.completed:
                    try:
                        reader.responses.retrieve(rid)
                    except Exception as exc:  # counted by kind
                        (lost if rid in before else unstored).append(rid)
                        reason = f"{type(exc).__name__}:{getattr(exc, 'status_code', '')}"
                        read_errors[reason] = read_errors.get(reason, 0) + 1
            for server in servers:
                server.proc.send_signal(signal.SIGTERM)
            for server in servers:
                server.proc.wait(30)
        finally:
            deployment.stop()
    completed = [rid for agent in crowd for rid, _ in agent.completed]
    records = deployment.records()
    ids = [record["response_id"] for record in records]
    failures = sorted((f for agent in crowd for f in agent.failures), key=lambda f: f.at_s)
    other: dict[str, int] = {}
    for record in records:
        if record["response_id"] not in completed:
            other[record["status"]] = other.get(record["status"], 0) + 1
    return FailoverReport(
        agents=agents,
        turns_completed=len(completed),
        promoted_after_s=round(promoted[0], 3) if promoted else float("nan"),
        moved_before_kill=bool(moved and moved[0]),
        recovered_after_s=round(max((f.at_s for f in failures), default=0.0), 3),
        failures=failures,
        lost_before_kill=lost,
        unstored_after_kill=unstored,
        read_errors=read_errors,
        records_missing=sorted(set(completed) - set(ids)),
        records_doubled=sorted({rid for rid in ids if ids.count(rid) > 1}),
        records_other=other,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--turns-after", type=int, default=20)
    parser.add_argument("--down-after-ms", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    for _ in range(args.repeats):
        report = run(agents=args.agents, processes=args.processes, turns_after=args.turns_after,
                     down_after_ms=args.down_after_ms)
        print(json.dumps(report.summary()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
