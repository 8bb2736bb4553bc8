"""Per output token: responses-cache in front of a fast fake engine vs that engine's own stream.

A fake vLLM (``responses_cache.testing.FakeVllm``: ``/inference/v1/generate``, one token per SSE
chunk, no sleep; it streams at well over 5,000 tokens/s) runs in a child process under uvicorn,
and ``responses-cache serve --backend vllm`` in another, in front of it over real HTTP. Three
clients, turn by turn in rotating order, each turn generating exactly ``--tokens`` output tokens
(``max_output_tokens``, the script is longer):

* ``direct`` — the token ids straight to the engine's ``/inference/v1/generate``, the SSE chunks
  parsed (the floor);
* ``ws``     — WebSocket mode, ``response.create`` (``store: false``), every event parsed;
* ``sse``    — ``POST /v1/responses`` with ``stream: true``, every event parsed.

Per renderer (``harmony``, ``chatml`` and ``hf:`` families built from the test assets), it reports
the median turn time of each mode, the per-token overhead ``(turn - direct) / tokens`` (median of
the per-round differences, with the 25th-75th percentile spread), and the server's CPU time per
token (user + system of the ``serve`` child, from ``/proc``, summed over the mode's turns:
much less noisy than wall time on a shared machine). ``--profile DIR`` runs the server under
cProfile and writes one ``.prof`` and a text report per renderer (the figures are then not the
ones to quote).

    python benchmarks/per_token.py                                  # harmony, chatml, hf:qwen
    python benchmarks/per_token.py --renderers harmony --rounds 20 --tokens 1024
    python benchmarks/per_token.py --renderers hf:llama3 --profile /tmp/prof
    python benchmarks/per_token.py --engine-rate 1000 --tokens 256   # each token arriving alone

With ``--engine-rate`` the engine keeps a pace (a real engine's): tokens then arrive one at a time,
the wall-time overhead is what the last token waits, and the server's CPU per token is the figure
that says how fast an engine it could keep up with.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

import httpx
import msgspec
import websockets

from benchmarks.suite.server import stop_process
from benchmarks.suite.stats import p50, percentile
from responses_cache.testing import free_port

MODEL = "fake-model"
MODES = ("direct", "ws", "sse")
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
_TICK = os.sysconf("SC_CLK_TCK")


def _words(n: int) -> str:
    """About ``n`` words of varied text (some of it beyond ASCII, so the decoder's UTF-8 path runs)."""
    extra = ("ünïcödé", "データ", "🚀", "naïve", "x=42;", "(a, b)")
    return " ".join(f"w{i % 997}" if i % 7 else extra[i % len(extra)] for i in range(n))


def _script(renderer: str, tokens: int) -> str:
    """What the fake engine samples: longer than ``tokens`` (the turn ends at ``max_tokens``)."""
    body = _words(tokens * 2)
    if renderer == "harmony":
        return f"<|channel|>final<|message|>{body}<|return|>"
    return body


def _renderer_spec(name: str, workdir: Path) -> str:
    """``harmony``/``chatml`` as they are; ``hf:FAMILY`` built from the test assets into ``workdir``."""
    if not name.startswith("hf:"):
        return name
    family = name[3:]
    if Path(family).is_dir():
        return name
    from tests.tokens.hf_assets import build_tokenizer_dir

    return "hf:" + str(build_tokenizer_dir(family, workdir / family))


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system (kernel) CPU time of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


# -- child processes ---------------------------------------------------------------------------


def _child_engine(renderer: str, tokens: int, port: int, rate: float) -> None:
    """The fake vLLM, one token per chunk, under uvicorn (run as ``--child-engine``); ``rate``:
    its tokens per second (0: as fast as it can)."""
    import uvicorn

    from responses_cache.testing import Behaviour, FakeVllm
    from responses_cache.tokens import get_renderer

    r = get_renderer(renderer)
    engine = FakeVllm(r.encoding, [_script(renderer, tokens)],
                      model=MODEL, report_cached=False)
    engine.default = Behaviour(chunk_tokens=1, interval_s=1 / rate if rate else 0.0)
    engine.requests = _Forgetful()
    uvicorn.run(engine.app(), host="127.0.0.1", port=port, log_level="warning")


class _Forgetful(list[Any]):
    """A request log that keeps nothing (the fake records every request; a benchmark makes many)."""

    def append(self, item: Any) -> None:
        pass


def _child_serve(config: str, port: int, profile: str | None) -> None:
    """``responses-cache serve``, optionally under cProfile (run as ``--child-serve``)."""
    from responses_cache.server.cli import main as serve

    argv = ["serve", "--config", config, "--port", str(port), "--log-level", "warning"]
    if profile is None:
        serve(argv)
        return
    import cProfile
    import signal

    # uvicorn re-raises the SIGTERM it caught once it has shut down: exit through ``finally``.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        serve(argv)
    finally:
        profiler.disable()
        profiler.dump_stats(profile)
        with open(profile + ".txt", "w") as report:
            stats = pstats.Stats(profile, stream=report)
            stats.sort_stats("tottime").print_stats(45)
            stats.sort_stats("cumulative").print_stats(60)


def _wait_http(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url).status_code == 200:
                return
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.2)


@contextlib.contextmanager
def _child(args: list[str], url: str, what: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.DEVNULL)
    try:
        _wait_http(url, proc, what)
        yield proc
    finally:
        stop_process(proc, timeout=60)


# -- clients -----------------------------------------------------------------------------------


@dataclass
class Figures:
    """One mode's turns: wall times, and the server's CPU over them."""

    turns: list[float] = field(default_factory=list)
    server_cpu: float = 0.0
    #: The part of ``server_cpu`` spent in the kernel (socket reads and writes, wake-ups).
    server_sys: float = 0.0
    engine_cpu: float = 0.0
    tokens: int = 0
    #: Events the client received (WebSocket frames or SSE events); direct: the engine's chunks.
    events: int = 0


_decode = msgspec.json.decode


class Clients:
    def __init__(self, engine_url: str, server_port: int, prompt: list[int], stops: list[int], tokens: int) -> None:
        self.generate = engine_url + "/inference/v1/generate"
        self.responses = f"http://127.0.0.1:{server_port}/v1/responses"
        self.ws_url = f"ws://127.0.0.1:{server_port}/v1/responses"
        self.tokens = tokens
        self.direct_body = {"token_ids": prompt, "stream": True, "sampling_params": {
            "max_tokens": tokens, "temperature": 0, "stop_token_ids": stops, "skip_special_tokens": False}}
        self.body = {"model": MODEL, "input": "Say a lot.", "store": False, "max_output_tokens": tokens}
        self.http = httpx.AsyncClient(timeout=600)
        self.ws: Any = None
        self.events = 0

    async def open(self) -> None:
        self.ws = await websockets.connect(self.ws_url, max_size=None, compression=None)

    async def close(self) -> None:
        await self.ws.close()
        await self.http.aclose()

    async def direct(self) -> int:
        sampled = 0
        self.events = 0
        async with self.http.stream("POST", self.generate, json=self.direct_body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    break
                self.events += 1
                for choice in _decode(line[6:]).get("choices") or ():
                    sampled += len(choice.get("token_ids") or ())
        return sampled

    async def websocket(self) -> int:
        await self.ws.send(json.dumps({"type": "response.create", **self.body}))
        self.events = 0
        while True:
            self.events += 1
            event = _decode(await self.ws.recv())
            if event["type"] in TERMINAL:
                break
        assert event["type"] in ("response.completed", "response.incomplete"), event
        return int(event["response"]["usage"]["output_tokens"])

    async def sse(self) -> int:
        event: dict[str, Any] = {}
        self.events = 0
        async with self.http.stream("POST", self.responses, json={**self.body, "stream": True}) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    self.events += 1
                    event = _decode(line[6:])
                    if event["type"] in TERMINAL:
                        break
        assert event.get("type") in ("response.completed", "response.incomplete"), event
        return int(event["response"]["usage"]["output_tokens"])


async def _measure(clients: Clients, server_pid: int, engine_pid: int, rounds: int, warmup: int) -> dict[str, Figures]:
    await clients.open()
    run = {"direct": clients.direct, "ws": clients.websocket, "sse": clients.sse}
    figures = {mode: Figures() for mode in MODES}
    try:
        for k in range(warmup + rounds):
            for mode in MODES[k % 3:] + MODES[:k % 3]:
                (user, sys_), engine_cpu = _cpu_seconds(server_pid), sum(_cpu_seconds(engine_pid))
                start = time.perf_counter()
                tokens = await run[mode]()
                elapsed = time.perf_counter() - start
                if k < warmup:
                    continue
                assert tokens == clients.tokens, (mode, tokens)
                f = figures[mode]
                f.turns.append(elapsed)
                user_after, sys_after = _cpu_seconds(server_pid)
                f.server_cpu += user_after + sys_after - user - sys_
                f.server_sys += sys_after - sys_
                f.engine_cpu += sum(_cpu_seconds(engine_pid)) - engine_cpu
                f.tokens += tokens
                f.events += clients.events
    finally:
        await clients.close()
    return figures


def _prompt(renderer: Any) -> tuple[list[int], list[int]]:
    from responses_cache.protocol.items import InputText, Message
    from responses_cache.protocol.tools import EMPTY_TOOLS

    log = renderer.begin(None, EMPTY_TOOLS)
    log = renderer.extend(log, [Message(role="user", content=[InputText("Say a lot.")])])
    return list(renderer.prompt(log)), list(renderer.sampling_stop_tokens)


def measure(
    name: str, spec: str, tokens: int, rounds: int, warmup: int, profile: Path | None, rate: float = 0.0
) -> dict[str, Any]:
    from responses_cache.tokens import get_renderer

    engine_port, server_port = free_port(), free_port()
    workdir = Path(tempfile.mkdtemp())
    config = workdir / "serve.toml"
    config.write_text(f'backend = "vllm"\nrenderer = "{spec}"\n[backend_options]\n'
                      f'base_urls = ["http://127.0.0.1:{engine_port}"]\nmodel = "{MODEL}"\ntemplate = "{spec}"\n')
    serve_args = ["--child-serve", str(config), str(server_port)]
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        serve_args.append(str(profile / f"serve-{name.replace(':', '-')}.prof"))
    prompt, stops = _prompt(get_renderer(spec))
    engine_url = f"http://127.0.0.1:{engine_port}"
    with _child(["--child-engine", spec, str(tokens), str(engine_port), str(rate)], engine_url + "/health", "the fake engine") as engine, \
         _child(serve_args, f"http://127.0.0.1:{server_port}/v1/models", "responses-cache serve") as server:
        clients = Clients(engine_url, server_port, prompt, stops, tokens)
        figures = asyncio.run(_measure(clients, server.pid, engine.pid, rounds, warmup))
    direct = figures["direct"].turns
    row: dict[str, Any] = {"renderer": name, "tokens": tokens, "rounds": rounds,
                           "engine_tokens_per_s": tokens / p50(direct)}
    for mode in MODES:
        f = figures[mode]
        entry: dict[str, Any] = {"turn_ms": p50(f.turns) * 1000,
                                 "server_cpu_us_per_token": f.server_cpu / f.tokens * 1e6,
                                 "server_sys_us_per_token": f.server_sys / f.tokens * 1e6,
                                 "engine_cpu_us_per_token": f.engine_cpu / f.tokens * 1e6,
                                 "events_per_turn": f.events / len(f.turns)}
        if mode != "direct":
            diffs = [(t - d) / tokens * 1e6 for t, d in zip(f.turns, direct, strict=True)]
            entry |= {"overhead_us_per_token": p50(diffs), "overhead_p25": percentile(diffs, 25),
                      "overhead_p75": percentile(diffs, 75)}
        row[mode] = entry
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child-engine":
        _child_engine(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))
        return 0
    if argv and argv[0] == "--child-serve":
        _child_serve(argv[1], int(argv[2]), argv[3] if len(argv) > 3 else None)
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--renderers", default="harmony,chatml,hf:qwen",
                        help="comma-separated: harmony, chatml, hf:FAMILY (test assets) or hf:DIR")
    parser.add_argument("--tokens", type=int, default=1024, help="output tokens per turn")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--engine-rate", type=float, default=0.0,
                        help="the fake engine's tokens/s, each token its own chunk (default 0: as fast as it can)")
    parser.add_argument("--profile", type=Path, help="run the server under cProfile, reports here")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp())
    rows = []
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'renderer':>10} {'mode':>6} {'turn p50 ms':>12} {'µs/token over direct (p25..p75)':>32} "
          f"{'server CPU µs/token (kernel)':>29} {'events/turn':>12} {'engine tok/s':>13}")
    for name in args.renderers.split(","):
        row = measure(name, _renderer_spec(name, workdir), args.tokens, args.rounds, args.warmup, args.profile,
                      args.engine_rate)
        rows.append(row)
        for mode in MODES:
            m = row[mode]
            over = (f"{m['overhead_us_per_token']:7.1f} ({m['overhead_p25']:.1f}..{m['overhead_p75']:.1f})"
                    if mode != "direct" else "")
            print(f"{name:>10} {mode:>6} {m['turn_ms']:>12.1f} {over:>32} {m['server_cpu_us_per_token']:>20.1f} ({m['server_sys_us_per_token']:5.1f}) "
                  f"{m['events_per_turn']:>12.0f} " + (f"{row['engine_tokens_per_s']:>13.0f}" if mode == "direct" else ""))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
