"""The CPU an engine adapter spends reading one streamed chunk: httpx's own transport vs aiohttp's.

A child process serves a stream of server-sent events over real HTTP (chunked, one vLLM-style
``/inference/v1/generate`` chunk every ``--interval`` seconds, each written alone, as a paced
engine's tokens arrive), and this process reads it with httpx-sse, as the adapters do, through
two clients in alternating rounds:

* ``httpcore`` — ``httpx.AsyncClient()`` with httpx's own transport (httpcore, h11, anyio);
* ``aiohttp``  — :func:`responses_cache.engine_http.engine_client`, the adapters' client
  (httpx's interface over ``httpx-aiohttp``'s transport).

It reports the reading process's CPU time (user + system) per chunk, median and spread over the
rounds, every chunk's JSON parsed as the adapters parse it.

    python benchmarks/engine_read.py
    python benchmarks/engine_read.py --chunks 4000 --interval 0.0002 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

import httpx
import msgspec
from httpx_sse import EventSource

from benchmarks.suite.server import stop_process
from benchmarks.suite.stats import p50
from responses_cache.engine_http import engine_client
from responses_cache.testing import free_port, wait_listening

CHUNK = b"data: " + msgspec.json.encode(
    {"request_id": "gen-1", "choices": [{"index": 0, "logprobs": None, "finish_reason": None, "token_ids": [12345]}]}
) + b"\n\n"
DONE = b"data: [DONE]\n\n"


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _serve(port: int, chunks: int, interval: float) -> None:
    """A keep-alive HTTP/1.1 server: every request gets ``chunks`` chunks on a clock."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            start = loop.time()
            for i in range(chunks):
                delay = start + i * interval - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(_frame(CHUNK))
            writer.write(_frame(DONE) + b"0\r\n\r\n")
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def _read(client: httpx.AsyncClient, url: str) -> int:
    n = 0
    async with client.stream("POST", url, content=b"{}", headers={"content-type": "application/json"}) as response:
        async for sse in EventSource(response).aiter_sse():
            if sse.data == "[DONE]":
                break
            msgspec.json.decode(sse.data)
            n += 1
    return n


async def _measure(url: str, rounds: int) -> dict[str, list[float]]:
    clients = {"httpcore": httpx.AsyncClient(timeout=60),
               "aiohttp": engine_client(timeout=60, connect_timeout=10)}
    figures: dict[str, list[float]] = {name: [] for name in clients}
    try:
        for client in clients.values():  # warm up: connect, import, first parse
            await _read(client, url)
        for _ in range(rounds):
            for name, client in clients.items():
                before = time.process_time()
                n = await _read(client, url)
                figures[name].append((time.process_time() - before) / n * 1e6)
    finally:
        for client in clients.values():
            await client.aclose()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000, help="chunks per stream")
    parser.add_argument("--interval", type=float, default=0.0005, help="seconds between chunks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child-server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_server:
        asyncio.run(_serve(args.child_server, args.chunks, args.interval))
        return 0
    port = free_port()
    child = subprocess.Popen([sys.executable, __file__, "--child-server", str(port),
                              "--chunks", str(args.chunks), "--interval", str(args.interval)])
    try:
        if not wait_listening(child, "127.0.0.1", port, timeout=30):
            raise RuntimeError("the stream's server did not start")
        figures = asyncio.run(_measure(f"http://127.0.0.1:{port}/", args.rounds))
    finally:
        stop_process(child, timeout=10)
    print(f"{args.chunks} chunks {args.interval * 1e3:g} ms apart, {args.rounds} rounds; reader CPU per chunk:")
    for name, values in figures.items():
        print(f"  {name:>9}: {p50(values):6.1f} µs (rounds: {', '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
