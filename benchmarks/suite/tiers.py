"""State tiers at about 100k tokens of history: what a continuation costs depending on where its
state is found.

* **Same process** (the in-process store, as ``serve`` runs by default): HTTP with
  ``previous_response_id`` against WebSocket mode on one server, interleaved turn by turn — the
  HTTP continuation finds its state in the process-wide hot cache and appends to its token log.
  HTTP is measured twice: with httpx (as the ``overhead`` scenario) and with a lean socket client,
  whose figure is the server's own share (httpx adds about a millisecond per streamed turn).
* **Many processes** (three servers sharing one Redis): a ``store: true`` WebSocket conversation
  grows on server A; from its latest response, each sample continues
  ``connection`` (A, same WebSocket), ``hot`` (A, over HTTP, lean client), ``snapshot`` (B, a new WebSocket
  after a reconnect: the chain and token-log snapshot in one round trip, the log extended) and
  ``full`` (C, snapshots off: the chain from the store, the conversation rendered in full).

The engine has zero latency, so the figures are the server's own work per turn.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .agent import AgentLoop, Mode
from .overhead import TASK, OverheadOptions, spec_for
from .redisproc import RedisProcess
from .server import ServerProcess, started
from .stats import p50, percentile, ratio
from .workload import code_text, prose_text, tool_output, tools, user_message

KEY = "sk-ws"  # one tenant for every loop of the many-process part
TIERS = ("connection", "hot", "snapshot", "full")


@dataclass(frozen=True, slots=True)
class TiersOptions:
    target_tokens: int = 100_000
    tokens_per_turn: int = 2_000
    #: Measured turns per mode (same process) and per tier (many processes).
    samples: int = 10
    instructions_tokens: int = 1_500
    pause_ms: float = 5.0
    renderer: str | None = "harmony"


def _overhead_options(opts: TiersOptions) -> OverheadOptions:
    return OverheadOptions(
        target_tokens=opts.target_tokens + opts.samples * opts.tokens_per_turn,
        tokens_per_turn=opts.tokens_per_turn,
        repeats=1,
        warmup_turns=2,
        instructions_tokens=opts.instructions_tokens,
        pause_ms=opts.pause_ms,
        renderer=opts.renderer,
    )


def estimated_turns(opts: TiersOptions) -> int:
    build = math.ceil(opts.target_tokens / opts.tokens_per_turn) + 1
    return len(SAME) * (build + opts.samples) + build + len(TIERS) * opts.samples


def run(opts: TiersOptions, tick: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
    same = _same_process(opts, tick)
    with RedisProcess() as redis:
        many = _many_processes(opts, redis.url + "/0", tick)
    return {
        "options": asdict(opts),
        "same_process": same,
        "many_processes": many,
        "summary": {
            "http_prev_over_ws_at_target": same["http_prev_lean_over_ws"],
            "http_prev_httpx_over_ws_at_target": same["http_prev_over_ws"],
            "full_over_snapshot": many["full_over_snapshot"],
            "history_tokens": many["history_tokens"],
        },
    }


#: The same-process modes: WebSocket, and HTTP ``previous_response_id`` measured with httpx (as
#: the ``overhead`` scenario does) and with the lean socket client (the server's share).
SAME = ("ws", "http_prev", "http_prev_lean")


def _same_process(opts: TiersOptions, tick: Callable[[int], None]) -> dict[str, Any]:
    ov = _overhead_options(opts)
    spec = dataclasses.replace(spec_for(ov), api_keys={f"sk-{m}": f"tenant-{m}" for m in SAME})
    instructions = prose_text(opts.instructions_tokens, seed=7)
    samples: dict[str, list[tuple[int, float, float]]] = {m: [] for m in SAME}
    with ServerProcess(spec) as server:
        loops = {
            m: AgentLoop(
                "ws" if m == "ws" else "http_prev", http_url=server.http_url, ws_url=server.ws_url,
                api_key=f"sk-{m}", instructions=instructions, tools=tools(), lean_http=m == "http_prev_lean",
            )
            for m in SAME
        }
        try:
            last = {m: loop.send([user_message(TASK)]) for m, loop in loops.items()}
            turn = 0
            while min(len(v) for v in samples.values()) < opts.samples:
                turn += 1
                text = code_text(opts.tokens_per_turn, seed=turn)
                for m in SAME[turn % 3 :] + SAME[: turn % 3]:  # rotate who goes first
                    loop = loops[m]
                    items = [tool_output(last[m].call_id() or "", text)]
                    history = loop.history_tokens
                    wire = loop.encode(items)
                    time.sleep(opts.pause_ms / 1e3)
                    last[m] = loop.send(items, wire)
                    if history >= opts.target_tokens:
                        samples[m].append((history, last[m].first_event_s * 1e3, last[m].completed_s * 1e3))
                    tick(1)
        finally:
            for loop in loops.values():
                loop.close()
        counters = server.get("/_bench/stats")["counters"]
    out: dict[str, Any] = {}
    for m in SAME:
        out[m] = _stats([f for _, f, _ in samples[m]], [c for _, _, c in samples[m]])
        out[m]["history_tokens_min"] = min((h for h, _, _ in samples[m]), default=0)
    for m in ("http_prev", "http_prev_lean"):
        out[f"{m}_over_ws"] = ratio(out[m]["first_p50_ms"], out["ws"]["first_p50_ms"])
        out[f"{m}_over_ws_completed"] = ratio(out[m]["completed_p50_ms"], out["ws"]["completed_p50_ms"])
    out["resolved"] = {k: v for k, v in counters.items() if k.startswith("resolved_")}
    out["samples"] = {m: [list(x) for x in samples[m]] for m in SAME}
    return out


def _many_processes(opts: TiersOptions, url: str, tick: Callable[[int], None]) -> dict[str, Any]:
    base = dataclasses.replace(spec_for(_overhead_options(opts)), store=url)
    with started(
        ServerProcess(base), ServerProcess(base), ServerProcess(dataclasses.replace(base, store_snapshots=False))
    ) as (a, b, c):
        instructions = prose_text(opts.instructions_tokens, seed=7)

        def loop(mode: Mode, server: ServerProcess) -> AgentLoop:
            return AgentLoop(
                mode, http_url=server.http_url, ws_url=server.ws_url, api_key=KEY,
                instructions=instructions, tools=tools(), store=True, lean_http=True,
            )

        main = loop("ws", a)
        times: dict[str, list[tuple[float, float]]] = {t: [] for t in TIERS}
        history = 0
        try:
            result = main.send([user_message(TASK)])
            turn = 0
            while main.history_tokens < opts.target_tokens:
                turn += 1
                result = main.send([tool_output(result.call_id() or "", code_text(opts.tokens_per_turn, seed=turn))])
                tick(1)
            history = main.history_tokens
            for k in range(opts.samples):
                turn += 1
                text = code_text(opts.tokens_per_turn, seed=turn)
                items = [tool_output(result.call_id() or "", text)]
                forks: list[tuple[str, Mode, ServerProcess]] = [
                    ("hot", "http_prev", a), ("snapshot", "ws", b), ("full", "ws", c),
                ]
                for tier, mode, server in forks[k % 3 :] + forks[: k % 3]:
                    fork = loop(mode, server)
                    try:
                        fork.previous_id = main.previous_id
                        wire = fork.encode(items)
                        time.sleep(opts.pause_ms / 1e3)
                        r = fork.send(items, wire)
                        times[tier].append((r.first_event_s * 1e3, r.completed_s * 1e3))
                    finally:
                        fork.close()
                    tick(1)
                wire = main.encode(items)
                time.sleep(opts.pause_ms / 1e3)
                result = main.send(items, wire)
                times["connection"].append((result.first_event_s * 1e3, result.completed_s * 1e3))
                tick(1)
        finally:
            main.close()
        resolved = {
            name: {k: v for k, v in server.get("/_bench/stats")["counters"].items() if k.startswith("resolved_")}
            for name, server in (("a", a), ("b", b), ("c", c))
        }
    out: dict[str, Any] = {
        t: _stats([f for f, _ in times[t]], [c for _, c in times[t]]) for t in TIERS
    }
    out["history_tokens"] = history
    out["full_over_snapshot"] = ratio(out["full"]["first_p50_ms"], out["snapshot"]["first_p50_ms"])
    out["resolved"] = resolved
    out["samples"] = {t: [list(x) for x in times[t]] for t in TIERS}
    return out


def _stats(first: list[float], completed: list[float]) -> dict[str, Any]:
    return {
        "n": len(first),
        "first_p50_ms": p50(first),
        "first_p90_ms": percentile(first, 90),
        "completed_p50_ms": p50(completed),
    }
