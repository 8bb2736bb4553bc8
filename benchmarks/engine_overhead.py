"""Overhead against a real engine: the same token ids straight to vLLM vs through responses-cache.

A real ``vllm serve`` (the CPU build, a tiny random-weight model; ``benchmarks/suite/vllmproc.py``)
with ``--enable-scale-out`` and the middleware, and three clients side by side, turn by turn in
rotating order, each continuing its own conversation of ``H`` tokens of history:

* ``direct``      — the client keeps the token ids itself (rendered off the clock with the same
  renderer) and streams ``POST /inference/v1/generate``: the engine's own floor;
* ``network``     — ``responses-cache serve --backend vllm`` in front of the engine, WebSocket
  mode, only the new message plus ``previous_response_id``;
* ``in-process``  — the middleware inside vLLM, WebSocket mode, the same.

Every turn appends a short user message and generates 16 tokens greedily; all three hit the
engine's prefix cache for the history. Reported per history size: the median turn time and time
to the first text token, and each mode's ratio to ``direct``.

    python benchmarks/engine_overhead.py                       # H = 1k, 10k, 50k; 8 turns each
    python benchmarks/engine_overhead.py --history 1000 --turns 4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

import httpx
from httpx_sse import connect_sse
from websockets.sync.client import ClientConnection, connect

from benchmarks.suite import vllmproc
from benchmarks.suite.redisproc import _free_port
from benchmarks.suite.server import stop_process
from benchmarks.suite.stats import p50, ratio
from responses_cache.protocol.items import InputText, Message, OutputText
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.tokens import get_renderer

MODEL = "tiny-oss"
OUTPUT_TOKENS = 16
MODES = ("direct", "network", "in-process")


class Direct:
    """The token-keeping client: tokens in, tokens out, nothing else."""

    def __init__(self, engine: vllmproc.VllmProcess) -> None:
        self.url = engine.url + "/inference/v1/generate"
        self.renderer = get_renderer("harmony")
        self.log = self.renderer.begin(None, EMPTY_TOOLS)
        self.client = httpx.Client(timeout=600)

    def turn(self, text: str) -> tuple[float, float]:
        r = self.renderer
        self.log = r.extend(self.log, [Message(role="user", content=[InputText(text)])])
        body = {"token_ids": list(r.prompt(self.log)), "stream": True,
                "sampling_params": {"max_tokens": OUTPUT_TOKENS, "temperature": 0,
                                    "stop_token_ids": list(r.sampling_stop_tokens), "skip_special_tokens": False}}
        message = r.encoding.encode_single_token("<|message|>")
        sampled: list[int] = []
        first = 0.0
        start = time.perf_counter()
        with connect_sse(self.client, "POST", self.url, json=body) as source:
            for sse in source.iter_sse():
                if sse.data == "[DONE]":
                    break
                for choice in json.loads(sse.data).get("choices") or ():
                    sampled += choice.get("token_ids") or ()
                    if not first and message in sampled[:-1]:
                        first = time.perf_counter() - start
        total = time.perf_counter() - start
        answer = Message(role="assistant", content=[OutputText(r.decode(sampled[sampled.index(message) + 1:]))])
        self.log = r.extend(self.log, [answer], sampled=sampled)
        return total, first


class WebSocketClient:
    """WebSocket mode: the new message and ``previous_response_id`` only."""

    def __init__(self, ws_url: str) -> None:
        self.ws: ClientConnection = connect(ws_url, max_size=None)
        self.previous: str | None = None

    def turn(self, text: str) -> tuple[float, float]:
        body = {"type": "response.create", "model": MODEL, "input": text, "store": False, "temperature": 0,
                "max_output_tokens": OUTPUT_TOKENS, "previous_response_id": self.previous}
        first = 0.0
        start = time.perf_counter()
        self.ws.send(json.dumps(body))
        while True:
            event = json.loads(self.ws.recv(timeout=600))
            if event["type"] == "response.output_text.delta" and not first:
                first = time.perf_counter() - start
            if event["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
                break
        total = time.perf_counter() - start
        assert event["type"] in ("response.completed", "response.incomplete"), event
        self.previous = event["response"]["id"]
        return total, first


def words(tokens: int) -> str:
    """About ``tokens`` tokens of text."""
    return " ".join(f"w{i % 997}" for i in range(tokens // 2))


@contextlib.contextmanager
def network_server(engine: vllmproc.VllmProcess) -> Iterator[str]:
    config = Path(tempfile.mkdtemp()) / "serve.toml"
    config.write_text(f'backend = "vllm"\nrenderer = "harmony"\n[backend_options]\nbase_urls = ["{engine.url}"]\n'
                      f'model = "{MODEL}"\ntemplate = "harmony"\n')
    port = _free_port()
    binary = Path(sys.executable).parent / "responses-cache"
    proc = subprocess.Popen([str(binary), "serve", "--config", str(config), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("responses-cache serve did not start")
            time.sleep(0.2)
        yield f"ws://127.0.0.1:{port}/v1/responses"
    finally:
        stop_process(proc)


def measure(engine: vllmproc.VllmProcess, network_ws: str, history: int, turns: int) -> dict[str, Any]:
    clients: dict[str, Any] = {"direct": Direct(engine), "network": WebSocketClient(network_ws),
                               "in-process": WebSocketClient(engine.ws_url)}
    opening = words(history)
    for client in clients.values():  # the history: prefilled once, then cached by the engine
        client.turn(opening)
    times: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for k in range(turns):
        order = MODES[k % 3:] + MODES[:k % 3]
        for mode in order:
            times[mode].append(clients[mode].turn(f"Turn {k}: go on."))
    row: dict[str, Any] = {"history": history}
    for mode in MODES:
        row[mode] = {"turn_ms": p50([t for t, _ in times[mode]]) * 1000,
                     "ttft_ms": p50([f for _, f in times[mode]]) * 1000}
    for mode in MODES[1:]:
        row[mode]["turn_ratio"] = ratio(row[mode]["turn_ms"], row["direct"]["turn_ms"])
        row[mode]["ttft_ratio"] = ratio(row[mode]["ttft_ms"], row["direct"]["ttft_ms"])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--history", default="1000,10000,50000", help="comma-separated history sizes (tokens)")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    sizes = [int(h) for h in args.history.split(",")]
    context = 1 << max(sizes[-1] + 2048, 4096).bit_length()
    python = vllmproc.provision()
    model = vllmproc.tiny_model(python, f"tiny-oss-{context // 1024}k", context=context)
    engine = vllmproc.VllmProcess(python, model, middleware={"RESPONSES_CACHE_MODEL": MODEL}, max_model_len=context)
    rows = []
    emit: Callable[[str], None] = print
    with vllmproc.started(engine), network_server(engine) as network_ws:
        emit(f"{'history':>8} {'mode':>11} {'turn p50 ms':>12} {'ttft p50 ms':>12} {'turn x':>7} {'ttft x':>7}")
        for history in sizes:
            row = measure(engine, network_ws, history, args.turns)
            rows.append(row)
            for mode in MODES:
                m = row[mode]
                emit(f"{history:>8} {mode:>11} {m['turn_ms']:>12.1f} {m['ttft_ms']:>12.1f} "
                     f"{m.get('turn_ratio', 1.0):>7.2f} {m.get('ttft_ratio', 1.0):>7.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
