"""A rolling restart under agent load (issue #36): ``responses-cache serve`` processes sharing
one Redis, behind nginx configured as shipped (``docs/nginx/responses-cache.conf``, ports
replaced: :mod:`.proxyproc`), coding agents of the official SDK over WebSocket mode through
nginx, and every process restarted in turn, as a deploy does it: ``SIGTERM``, wait for it to exit,
start it again, wait until it is ready, then the next.

Each agent runs a tool loop (a user turn asks for a command, gets the call, sends the command's
output, gets the answer; ``store: true``, chained by ``previous_response_id``). When its
connection closes (the drain's 1001 between turns, or ``websocket_connection_limit_reached`` for
a turn sent on a draining connection) it reconnects once, through nginx, and sends the same turn
again with the same ``previous_response_id``: that turn *moved*. A turn that fails otherwise, or
finds the new connection closed too, *failed*.

What a run reports (:class:`RestartReport`): turns failed as the clients saw them (goal 0), turns
cancelled by the drain deadline (goal 0 when ``drain_timeout_s`` exceeds the longest turn), the
conversations that cannot be read back whole from the store afterwards (goal 0), the usage
records missing or doubled (goal 0), every stopped process's exit status (goal 0), and the
latency of the turns that moved against the others: time from the first send to the terminal
event, and from the client seeing the close to the resent turn's first event.

    python -m benchmarks.suite.rolling_restart --agents 8 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .deployment import MODEL, TOOLS, Deployment
from .failover import Failure, failure_of
from .proxyproc import NginxProcess, nginx_binary
from .redisproc import RedisProcess
from .stats import percentile

KEY = "sk-rolling-restart"
#: The error code of a turn sent on a draining connection (the client opens a new one).
MOVE_ON = "websocket_connection_limit_reached"
KINDS = ("call", "answer")


@dataclass
class Turn:
    """One ``response.create`` as its agent saw it (times in seconds, monotonic)."""

    agent: str
    #: ``call`` (a user turn: the model calls the tool) or ``answer`` (the tool's output sent).
    kind: str
    sent: float
    #: When the terminal event arrived (``nan`` until then).
    done: float = math.nan
    response_id: str | None = None
    failure: Failure | None = None
    #: When the first event arrived (on the first connection).
    first_event: float | None = None
    #: When the client saw its connection close (or the drain's error event): the turn moved.
    closed: float | None = None
    #: Why: ``closed`` (closed before the turn began: the drain's 1001 between turns),
    #: ``move-on`` (sent on a draining connection: ``websocket_connection_limit_reached``),
    #: ``cut`` (closed while the turn ran: the drain deadline).
    moved_by: str | None = None
    #: When the first event of the turn sent again on the new connection arrived.
    resent_first_event: float | None = None

    @property
    def moved(self) -> bool:
        return self.closed is not None


@dataclass
class Latency:
    """Percentiles of a set of durations, in seconds."""

    count: int
    p50: float
    p90: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Latency:
        return cls(len(values), *(round(percentile(values, q), 3) for q in (50, 90, 100)))


@dataclass
class Restart:
    """One process's restart: how long it drained and how long its successor took to be ready."""

    index: int
    exit_code: int | None
    drained_s: float
    started_s: float
    traceback: bool


@dataclass
class RestartReport:
    agents: int
    processes: int
    rounds: int
    drain_timeout_s: float
    turns_completed: int
    #: Turns that failed as the client saw them: ``kind:code`` counted (goal: none).
    turns_failed: dict[str, int]
    #: Usage records with status ``cancelled``: turns cut at the drain deadline.
    turns_cancelled: int
    #: Agents whose conversation cannot be read back whole from its last response.
    conversations_lost: list[str]
    #: Completed responses that ``GET /v1/responses/{id}`` cannot give back afterwards.
    responses_unreadable: list[str]
    records_missing: list[str]
    records_doubled: list[str]
    #: Records of responses no client saw complete, by status.
    records_other: dict[str, int]
    #: Turns that moved, by why (see :attr:`Turn.moved_by`).
    moved_by: dict[str, int]
    restarts: list[Restart]
    #: Exit status of every process stopped, the restarts' and the final stop's (goal: all 0).
    exit_codes: list[int | None]
    #: Time from the first send to the terminal event, by kind of turn (``call``, ``answer``):
    #: turns that moved, and the others.
    moved: dict[str, Latency]
    stayed: dict[str, Latency]
    #: Time from the client seeing the close to the first event of the turn sent again (a new
    #: connection through nginx, the parent hydrated from the store on another process).
    close_to_first_event: Latency
    #: Time from a moved turn's send to the client seeing the close (about 0 for a close
    #: between turns; the time it ran for a turn cut at the drain deadline).
    sent_to_close: Latency
    wall_s: float

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out["restarts"] = {
            "count": len(self.restarts),
            "drained_s_max": round(max((r.drained_s for r in self.restarts), default=0.0), 3),
            "started_s_max": round(max((r.started_s for r in self.restarts), default=0.0), 3),
            "tracebacks": sum(r.traceback for r in self.restarts),
        }
        for name in ("responses_unreadable", "records_missing", "records_doubled"):
            out[name] = len(out[name])
        return out


@dataclass
class Agent:
    """A coding agent over WebSocket mode that reconnects once on a close (see the module)."""

    client: Any
    name: str
    think_s: float
    turns: list[Turn] = field(default_factory=list)
    previous: str | None = None
    #: Tool loops done (a user turn and its answer both completed).
    rounds: int = 0
    #: Whether a turn of it failed (its conversation then has a gap; not counted as lost).
    broken: bool = False
    conn: Any | None = None

    async def run(self, stop: asyncio.Event) -> None:
        self.conn = await self.client.responses.connect().enter()
        try:
            while not stop.is_set():
                user = [{"role": "user", "content": f"{self.name} turn {self.rounds}: run `ls -{self.rounds}`"}]
                called = await self.turn("call", user)
                call = next((i for i in called.output if i.type == "function_call"), None) if called else None
                if call is not None:
                    output = [{"type": "function_call_output", "call_id": call.call_id, "output": f"file{self.rounds}\n"}]
                    answered = await self.turn("answer", output)
                    if answered is not None and f"file{self.rounds}" in answered.output_text:
                        self.rounds += 1
                    elif answered is not None:
                        self._fail(self.turns[-1], "answer")  # not the answer the tool's output asks for
                elif called is not None:
                    self._fail(self.turns[-1], "no-call")
                await asyncio.sleep(self.think_s)
        finally:
            if self.conn is not None:
                await self.conn.close()

    def _fail(self, turn: Turn, failure: Failure | str, code: str | None = None) -> None:
        """Count ``turn`` failed: with ``failure``, or a :class:`Failure` of that kind and ``code``."""
        if isinstance(failure, str):
            failure = Failure(self.name, time.monotonic() - turn.sent, failure, code, None)
        turn.failure, self.broken = failure, True

    async def turn(self, kind: str, input: list[Any]) -> Any | None:
        """One ``response.create`` to its end: the completed response, or None (failed)."""
        turn = Turn(self.name, kind, time.monotonic())
        self.turns.append(turn)
        for attempt in (0, 1):
            event = await self._try(input, turn, attempt)
            if event is not None and event.type == "response.completed":
                turn.done, turn.response_id = time.monotonic(), event.response.id
                self.previous = event.response.id
                return event.response
            closed = event is None or (event.type == "error" and _code(event) == MOVE_ON)
            if not closed or attempt == 1:
                self._fail(turn, failure_of(self.name, time.monotonic() - turn.sent, event))
                return None
            turn.closed = time.monotonic()
            turn.moved_by = "move-on" if event is not None else "closed" if turn.first_event is None else "cut"
            if self.conn is not None:
                await self.conn.close()
            try:
                self.conn = await self.client.responses.connect().enter()
            except Exception as exc:  # counted: a reconnect the proxy could not place
                self.conn = None  # the next turn connects again
                self._fail(turn, "connect", type(exc).__name__)
                return None
        raise AssertionError("unreachable")

    async def _try(self, input: list[Any], turn: Turn, attempt: int) -> Any | None:
        """Send the turn, and return its terminal event (None: the connection closed first)."""
        from websockets.exceptions import ConnectionClosed

        if self.conn is None:
            return None
        try:
            await self.conn.response.create(
                model=MODEL, input=input, tools=TOOLS, store=True, previous_response_id=self.previous
            )
            async for event in self.conn:
                now = time.monotonic()
                if attempt == 0 and turn.first_event is None:
                    turn.first_event = now
                if attempt == 1 and turn.resent_first_event is None:
                    turn.resent_first_event = now
                if event.type in ("response.completed", "response.failed", "response.incomplete", "error"):
                    return event
        except ConnectionClosed:
            pass
        return None  # closed (the drain's 1001) before the terminal event


def _code(event: Any) -> str | None:
    error = event.model_dump().get("error") or {}
    return error.get("code") if isinstance(error, dict) else None


def run(
    *, agents: int = 8, processes: int = 2, rounds: int = 1, turns_between: int = 2,
    tokens_per_s: float = 100.0, answer_tokens: int = 24, drain_timeout_s: float = 30.0,
    think_s: float = 0.05, work_dir: Path | None = None, timeout_s: float = 60.0,
) -> RestartReport:
    """One run (see the module's docstring): ``rounds`` rolling restarts of every process, each
    agent doing ``turns_between`` more tool loops before the first and after each restart."""
    from openai import AsyncOpenAI, OpenAI

    nginx = nginx_binary()
    if nginx is None:
        raise RuntimeError("no nginx binary (Debian: apt-get install nginx)")
    tmp = Path(work_dir or tempfile.mkdtemp(prefix="responses-cache-rolling-restart-"))
    begun = time.monotonic()
    restarts: list[Restart] = []
    exit_codes: list[int | None] = []
    with RedisProcess() as redis:
        deployment = Deployment(
            tmp, redis.url + "/0", tokens_per_s, count=processes, key=KEY, answer_tokens=answer_tokens,
            drain_timeout_s=drain_timeout_s,
        )
        try:
            deployment.start_all()
            with NginxProcess(nginx, tmp / "nginx", deployment.ports) as proxy:
                client = AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=2)
                crowd = [Agent(client, f"agent{i}", think_s) for i in range(agents)]

                async def scenario() -> None:
                    stop = asyncio.Event()
                    runs = asyncio.gather(*(agent.run(stop) for agent in crowd))

                    async def until_each(more: int) -> None:
                        """Until every agent has tried ``more`` more tool loops."""
                        targets = [len(agent.turns) + 2 * more for agent in crowd]
                        deadline = time.monotonic() + timeout_s
                        while any(len(a.turns) < t for a, t in zip(crowd, targets, strict=True)):
                            if runs.done():
                                runs.result()  # an agent raised: its error
                            if time.monotonic() > deadline:
                                raise RuntimeError("the agents stalled")
                            await asyncio.sleep(0.02)

                    try:
                        await until_each(turns_between)
                        for _ in range(rounds):
                            for index in range(processes):
                                restarts.append(await _restart(deployment, index, drain_timeout_s + 30))
                                exit_codes.append(restarts[-1].exit_code)
                                await asyncio.sleep(proxy.settle_s)
                                await until_each(turns_between)
                    finally:
                        stop.set()
                        await runs

                asyncio.run(asyncio.wait_for(scenario(), timeout_s * (1 + 2 * rounds * processes)))
                unreadable, lost = _read_back(OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=2), crowd)
            for server in deployment.processes:
                server.proc.send_signal(signal.SIGTERM)
            for server in deployment.processes:
                exit_codes.append(server.proc.wait(drain_timeout_s + 30))
        finally:
            deployment.stop()
    return _report(
        crowd, deployment.records(), restarts=restarts, exit_codes=exit_codes, unreadable=unreadable,
        lost=lost, processes=processes, rounds=rounds, drain_timeout_s=drain_timeout_s,
        wall_s=time.monotonic() - begun,
    )


async def _restart(deployment: Deployment, index: int, wait_s: float) -> Restart:
    """``SIGTERM`` to process ``index``, its exit awaited, a new one started and ready."""
    import subprocess

    old = deployment.processes[index]
    stopped = time.monotonic()
    old.proc.send_signal(signal.SIGTERM)
    try:
        code: int | None = await asyncio.to_thread(old.proc.wait, wait_s)
    except subprocess.TimeoutExpired:
        code = None
        old.kill()
    exited = time.monotonic()
    await asyncio.to_thread(deployment.start, index)
    return Restart(index, code, round(exited - stopped, 3), round(time.monotonic() - exited, 3), "Traceback" in old.output())


def _read_back(client: Any, crowd: list[Agent]) -> tuple[list[str], list[str]]:
    """Every completed response read back, and each conversation whole from its last response
    (its first user turn first; without a failed turn, 4 items per tool loop but the last's answer)."""
    unreadable: list[str] = []
    lost: list[str] = []
    for agent in crowd:
        for turn in agent.turns:
            if turn.response_id is None:
                continue
            try:
                client.responses.retrieve(turn.response_id)
            except Exception:  # counted
                unreadable.append(turn.response_id)
        if agent.previous is None:
            continue
        try:
            items = list(client.responses.input_items.list(agent.previous, order="asc", limit=100))
        except Exception:  # counted
            lost.append(agent.name)
            continue
        whole = bool(items) and f"{agent.name} turn 0" in json.dumps(items[0].model_dump())
        # A failed turn leaves a gap the count cannot predict; without one, every loop is there.
        if not whole or (not agent.broken and len(items) != 4 * agent.rounds - 1):
            lost.append(agent.name)
    return unreadable, lost


def _report(
    crowd: list[Agent], records: list[dict[str, Any]], *, restarts: list[Restart], exit_codes: list[int | None],
    unreadable: list[str], lost: list[str], processes: int, rounds: int, drain_timeout_s: float, wall_s: float,
) -> RestartReport:
    turns = [turn for agent in crowd for turn in agent.turns]
    completed = [t.response_id for t in turns if t.response_id is not None]
    ids = Counter(record["response_id"] for record in records)
    done = [t for t in turns if t.response_id is not None]
    failed = Counter(f"{t.failure.kind}:{t.failure.code}" for t in turns if t.failure is not None)
    seen = set(completed)
    # (sent, closed, the resent turn's first event) of each completed turn that moved
    resent = [(t.sent, t.closed, t.resent_first_event) for t in done
              if t.closed is not None and t.resent_first_event is not None]
    return RestartReport(
        agents=len(crowd),
        processes=processes,
        rounds=rounds,
        drain_timeout_s=drain_timeout_s,
        turns_completed=len(completed),
        turns_failed=dict(failed),
        turns_cancelled=sum(1 for record in records if record["status"] == "cancelled"),
        conversations_lost=lost,
        responses_unreadable=unreadable,
        records_missing=sorted(set(completed) - set(ids)),
        records_doubled=sorted(rid for rid, n in ids.items() if n > 1),
        records_other=dict(Counter(r["status"] for r in records if r["response_id"] not in seen)),
        moved_by=dict(Counter(t.moved_by for t in turns if t.moved_by is not None)),
        restarts=restarts,
        exit_codes=exit_codes,
        moved={kind: Latency.of([t.done - t.sent for t in done if t.moved and t.kind == kind]) for kind in KINDS},
        stayed={kind: Latency.of([t.done - t.sent for t in done if not t.moved and t.kind == kind]) for kind in KINDS},
        close_to_first_event=Latency.of([first - closed for _, closed, first in resent]),
        sent_to_close=Latency.of([closed - sent for sent, closed, _ in resent]),
        wall_s=round(wall_s, 1),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="rolling restarts of every process")
    parser.add_argument("--turns-between", type=int, default=2, help="tool loops per agent between restarts")
    parser.add_argument("--tokens-per-s", type=float, default=100.0, help="the simulated engine's decode rate")
    parser.add_argument("--answer-tokens", type=int, default=24)
    parser.add_argument("--drain-timeout-s", type=float, default=30.0)
    parser.add_argument("--think-s", type=float, default=0.05, help="an agent's pause between tool loops")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    for _ in range(args.repeats):
        report = run(
            agents=args.agents, processes=args.processes, rounds=args.rounds, turns_between=args.turns_between,
            tokens_per_s=args.tokens_per_s, answer_tokens=args.answer_tokens, drain_timeout_s=args.drain_timeout_s,
            think_s=args.think_s,
        )
        print(json.dumps(report.summary()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
