"""Scale: many concurrent WebSocket connections, each holding a large cached context.

``connections`` sockets each build a context of about ``context_tokens`` tokens (one large user
message, ``store: false`` so the connection cache is the only copy), then all of them run
``turns`` short turns concurrently. Reported: errors, turns/second, per-turn latency, and cache
memory per token, measured outside the server code: the server process's RSS before and after the
contexts exist (from ``/proc/<pid>/status``), divided by the tokens the caches hold, next to an
object-level estimate (:func:`.footprint.cache_footprint`, no tracemalloc).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from .agent import MODEL
from .clients import TurnTiming, ws_frame, ws_turn_async
from .runner import ServerSpec, raise_fd_limit
from .server import ServerProcess
from .stats import percentile
from .workload import CHARS_PER_TOKEN, code_text, prose_text, tools, user_message


@dataclass(frozen=True, slots=True)
class ScaleOptions:
    connections: int = 1_000
    context_tokens: int = 16_000
    turns: int = 10
    turn_tokens: int = 100
    build_concurrency: int = 32
    renderer: str | None = "harmony"
    tracemalloc: bool = False
    profile_dir: str | None = None


@dataclass(slots=True)
class _Conn:
    ws: ClientConnection
    previous_id: str | None = None
    tokens: int = 0


def steps(opts: ScaleOptions) -> int:
    return opts.connections * (1 + opts.turns)


def run(opts: ScaleOptions, tick: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
    fd_limit = raise_fd_limit(opts.connections + 256)
    spec = ServerSpec(
        instant=True, renderer=opts.renderer, context_window=1 << 22, tracemalloc=opts.tracemalloc
    )
    with ServerProcess(spec) as server:
        result = asyncio.run(_run(server, opts, tick))
    result["fd_limit"] = fd_limit
    result["options"] = asdict(opts)
    return result


async def _run(
    server: ServerProcess, opts: ScaleOptions, tick: Callable[[int], None]
) -> dict[str, Any]:
    errors: list[str] = []
    corpus = code_text(opts.context_tokens * 4, seed=99)
    span = int(opts.context_tokens * CHARS_PER_TOKEN)
    instructions = prose_text(200, seed=3)
    tool_list = tools()

    conns = await _open(server, opts.connections, errors)
    await _warm(conns[:4], instructions, tool_list, errors)
    rss_before = server.rss()
    if opts.tracemalloc:
        server.post("/_bench/tracemalloc/mark")

    limit = asyncio.Semaphore(opts.build_concurrency)
    build_latency: list[float] = []

    async def build(i: int, conn: _Conn) -> None:
        offset = (i * 7919 * 4) % (len(corpus) - span)
        text = f"Context {i}:\n" + corpus[offset : offset + span]
        body = {
            "model": MODEL,
            "instructions": instructions,
            "tools": tool_list,
            "input": [user_message(text)],
            "store": False,
        }
        async with limit:
            r = await _turn(conn, body, errors)
        if r is not None:
            build_latency.append(r.completed_s)
        tick(1)

    t0 = time.perf_counter()
    await asyncio.gather(*(build(i, c) for i, c in enumerate(conns)))
    build_s = time.perf_counter() - t0

    built = _memory(server, opts, rss_before, sum(c.tokens for c in conns))

    if opts.profile_dir:
        server.post("/_bench/profile/start")
    turn_latency: list[float] = []
    first_latency: list[float] = []
    question = prose_text(opts.turn_tokens, seed=5)

    async def chat(conn: _Conn) -> None:
        for k in range(opts.turns):
            body = {
                "model": MODEL,
                "instructions": instructions,
                "tools": tool_list,
                "store": False,
                "input": [user_message(f"Turn {k}: {question}")],
                "previous_response_id": conn.previous_id,
            }
            r = await _turn(conn, body, errors)
            if r is not None:
                turn_latency.append(r.completed_s)
                first_latency.append(r.first_event_s)
            tick(1)

    t1 = time.perf_counter()
    await asyncio.gather(*(chat(c) for c in conns))
    turns_s = time.perf_counter() - t1
    if opts.profile_dir:
        path = Path(opts.profile_dir) / "profile-scale-turns"
        path.with_suffix(".txt").write_text(
            server.post(f"/_bench/profile/stop?path={path}.prof&top=30")["text"]
        )
    steady = _memory(server, opts, rss_before, sum(c.tokens for c in conns))
    await asyncio.gather(*(c.ws.close() for c in conns), return_exceptions=True)

    return {
        "connections": len(conns),
        "errors": len(errors),
        "error_samples": errors[:5],
        "build_s": build_s,
        "build_p50_ms": percentile(build_latency, 50) * 1e3,
        "turns_total": len(turn_latency),
        "turns_per_s": len(turn_latency) / turns_s if turns_s > 0 else 0.0,
        "turn_p50_ms": percentile(turn_latency, 50) * 1e3,
        "turn_p99_ms": percentile(turn_latency, 99) * 1e3,
        "first_event_p50_ms": percentile(first_latency, 50) * 1e3,
        "rss_before_bytes": rss_before,
        # The measure: right after the contexts are built.
        "cached_tokens": built["cached_tokens"],
        "rss_bytes_per_token": built["rss_bytes_per_token"],
        "object_bytes_per_token": built["object_bytes_per_token"],
        "after_build": built,
        # After the turns, when each connection's latest frame is a small one.
        "after_turns": steady,
    }


def _memory(
    server: ServerProcess, opts: ScaleOptions, rss_before: int, client_tokens: int
) -> dict[str, Any]:
    """Server RSS growth and cache footprint per cached token, now."""
    # A turn's client has its terminal event before the server puts the response in the cache
    # (and packs the history behind it): let the last turns get there first.
    time.sleep(0.5)
    stats = server.get("/_bench/stats?footprint=1")
    footprint = stats["footprint"]
    tokens = int(footprint["cached_tokens"]) or client_tokens
    rss = int(stats["rss"])
    return {
        "cached_tokens": tokens,
        "rss_bytes": rss,
        "rss_bytes_per_token": (rss - rss_before) / tokens if tokens else float("nan"),
        "object_bytes_per_token": footprint["total_bytes"] / tokens if tokens else float("nan"),
        "footprint": footprint,
        "tracemalloc": server.get("/_bench/tracemalloc?top=12")["sites"]
        if opts.tracemalloc
        else None,
    }


async def _open(server: ServerProcess, n: int, errors: list[str]) -> list[_Conn]:
    limit = asyncio.Semaphore(64)

    async def one() -> _Conn | None:
        async with limit:
            try:
                ws = await connect(
                    server.ws_url,
                    max_size=None,
                    compression=None,
                    open_timeout=120,
                    ping_interval=None,
                )
            except Exception as exc:  # counted, reported
                errors.append(f"connect: {exc!r}")
                return None
        return _Conn(ws)

    opened = await asyncio.gather(*(one() for _ in range(n)))
    return [c for c in opened if c is not None]


async def _warm(
    conns: list[_Conn], instructions: str, tool_list: list[dict[str, Any]], errors: list[str]
) -> None:
    """One tiny turn each (imports, tokenizer caches), then forget it: the contexts start fresh."""
    for conn in conns:
        body = {
            "model": MODEL,
            "instructions": instructions,
            "tools": tool_list,
            "input": "warm-up",
            "store": False,
        }
        await _turn(conn, body, errors)
        conn.previous_id, conn.tokens = None, 0


async def _turn(conn: _Conn, body: dict[str, Any], errors: list[str]) -> TurnTiming | None:
    try:
        result = await ws_turn_async(conn.ws, ws_frame(body))
    except Exception as exc:  # counted, reported
        errors.append(repr(exc)[:300])
        return None
    conn.previous_id = result.id
    conn.tokens = result.input_tokens + result.output_tokens
    return result
