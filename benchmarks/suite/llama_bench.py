"""Per-turn latency against a real ``llama-server``: responses-cache WebSocket mode vs the server's
own endpoints with the whole history each turn, and vs token ids straight to the server.

``python -m benchmarks.suite.llama_bench [--history 1000 8000 30000] [--output 16 256] [--turns 3]
[--keep keep template] [--cuda --shape qwen3-0.6b]``

One ``llama-server`` (built by :mod:`.llamaproc`, one slot, CPU) serves the engine suite's tiny
random-weight Qwen-style GGUF (Qwen3's real tokenizer and template). ``--cuda``: a CUDA build of
the server with every layer on the GPU, and ``--shape qwen3-0.6b`` a model of Qwen3-0.6B's size
and shape (random weights): the GPU run, ``benchmarks/gpu/llama_cuda.sh``. For each history size and
output length, each path runs the same conversation: a warm-up turn that carries the history
(fixed user and assistant messages of about 250 tokens each, ending with a user message), then ``--turns`` measured turns,
each a short new user message; every answer is exactly ``output`` tokens (``ignore_eos``):

* ``floor``: token ids straight to ``POST /completion`` (the previous prompt, its answer's ids and
  the new turn's ids; ``cache_prompt``), what any client of the server pays at least;
* ``ws keep`` / ``ws template``: WebSocket mode (``previous_response_id`` and the new message
  only) through ``responses-cache`` in its own process, the ``llamacpp`` backend,
  ``renderer = "gguf:<file>"`` with the renderer's history mode (``--keep``): ``keep`` holds the
  ids the model sampled, as the floor does; ``template`` (the renderer's default) renders each
  answer from its text, which the random model's noise often tokenizes to other ids than it
  sampled, so the server evaluates that answer again (a real model's answers mostly tokenize to
  what it sampled);
* ``chat``: ``POST /v1/chat/completions`` with the whole history each turn (streaming);
* ``responses``: the server's own ``POST /v1/responses`` with the whole history each turn.

Time to first token (from the request's sending to the first text: a chunk with ``content`` for
the floor, a text delta for the others; a token that ends inside a character has none) and turn
time (to the end of the stream), the median over the measured turns, each path's ratio to the floor, and the median of
the prompt tokens the server evaluated per measured turn (its log: what its slot's cache did not
hold) are printed as a table; each row's progress line also has every turn's times and, for
WebSocket mode, the CPU time the responses-cache process used per measured turn.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from responses_cache.testing import free_port, wait_listening

from . import llamaproc, vllmproc
from .footprint import cpu_seconds

_ROOT = Path(__file__).resolve().parents[2]
_WORDS = ("plan", "check", "file", "test", "build", "merge", "review", "deploy", "cache", "token", "slot",
          "server", "engine", "turn", "prompt", "history")


def _message(n: int, words: int = 190) -> str:
    """A fixed message of about 250 Qwen tokens, different for each ``n``."""
    return " ".join(f"{_WORDS[(n * 7 + i) % len(_WORDS)]}{(n + i) % 97}" for i in range(words))


def history(tokens: int, count: Any) -> list[dict[str, str]]:
    """User/assistant message pairs, then a user message, until the rendered history holds
    ``tokens`` tokens (ending with a user message: templates render an answer after the last
    user message differently, Qwen3's with an empty thinking block)."""
    messages: list[dict[str, str]] = [{"role": "user", "content": _message(0)}]
    n = 1
    while count(messages) < tokens:
        messages += [{"role": "assistant", "content": _message(n + 1000)}, {"role": "user", "content": _message(n)}]
        n += 1
    return messages


def _sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def _item(role: str, text: str) -> dict[str, Any]:
    """A message as Responses input (an assistant's as the output item it was)."""
    if role == "assistant":
        return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    return {"role": role, "content": text}


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code != 200:
        raise RuntimeError(f"{response.request.url} answered {response.status_code}: {response.read()[:500]!r}")
    return response


def _ids(response: httpx.Response, sampled: list[int]) -> Iterator[dict[str, Any]]:
    """The stream's chunks, keeping the sampled ids."""
    for chunk in _sse(response):
        sampled.extend(chunk.get("tokens") or ())
        yield chunk


def _chat_deltas(response: httpx.Response, answer: list[str]) -> Iterator[str]:
    for chunk in _sse(response):
        for choice in chunk.get("choices") or ():
            delta = (choice.get("delta") or {}).get("content") or ""
            answer.append(delta)
            yield delta


def _response_deltas(response: httpx.Response, answer: list[str]) -> Iterator[str]:
    for event in _sse(response):
        delta = event.get("delta") or "" if event.get("type") == "response.output_text.delta" else ""
        answer.append(delta)
        yield delta


def _ws_events(ws: Any) -> Iterator[dict[str, Any]]:
    while True:
        event = json.loads(ws.recv(timeout=600))
        yield event
        if event["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
            return


class Paths:
    """The ways of sending one conversation's turns (``fronts``: responses-cache's URL and process
    id by the renderer's history mode; ``cpu``: after a WebSocket run, the process's CPU seconds
    per measured turn, by mode)."""

    def __init__(self, server: llamaproc.LlamaServer, fronts: dict[str, tuple[str, int]], output: int) -> None:
        self.server, self.fronts, self.output = server, fronts, output
        self.cpu: dict[str, float] = {}
        # A connection per request: llama-server may close one after a chat stream, and a reused
        # one would then fail (WebSocket mode keeps its one connection, as clients do).
        self.client = httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0))

    @staticmethod
    def _timed(start: float, events: Iterator[Any], first: Any) -> tuple[float, float, Any]:
        """(time to the first event that ``first`` accepts, to the last, the last event), from
        ``start``: taken before the request is sent -- an HTTP client's ``stream()`` returns only
        once the response's headers are in, which ``llama-server`` sends anywhere from when it
        takes the request to with its first token."""
        ttft: float | None = None
        last = None
        for event in events:
            if ttft is None and first(event):
                ttft = time.perf_counter() - start
            last = event
        return (ttft if ttft is not None else float("nan")), time.perf_counter() - start, last

    def floor(self, base: list[dict[str, str]], turns: list[str]) -> list[tuple[float, float]]:
        """The ids a token log holds: the previous prompt, the sampled ids, then the new turn's
        ids (the ChatML text the template writes around a user message)."""
        post = self.server.post
        prompt = post("/tokenize", {"content": post("/apply-template", {"messages": base})["prompt"]})["tokens"]
        results = []
        for n, text in enumerate([None, *turns]):
            if text is not None:
                turn = f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
                prompt = prompt + post("/tokenize", {"content": turn, "parse_special": True})["tokens"]
            body = {"prompt": prompt, "stream": True, "cache_prompt": True, "return_tokens": True,
                    "n_predict": self.output, "ignore_eos": True, "temperature": 0, "id_slot": 0}
            sampled: list[int] = []
            start = time.perf_counter()
            with self.client.stream("POST", self.server.url + "/completion", json=body) as response:
                ttft, total, _ = self._timed(start, _ids(_checked(response), sampled), lambda c: bool(c.get("content")))
            prompt = prompt + sampled
            if n:
                results.append((ttft, total))
        return results

    def chat(self, base: list[dict[str, str]], turns: list[str]) -> list[tuple[float, float]]:
        results = []
        messages = list(base)
        for n, text in enumerate([None, *turns]):
            if text is not None:
                messages.append({"role": "user", "content": text})
            body = {"model": "tiny", "messages": messages, "stream": True, "max_tokens": self.output,
                    "ignore_eos": True, "temperature": 0}
            answer: list[str] = []
            start = time.perf_counter()
            with self.client.stream("POST", self.server.url + "/v1/chat/completions", json=body) as response:
                ttft, total, _ = self._timed(start, _chat_deltas(_checked(response), answer), bool)
            messages.append({"role": "assistant", "content": "".join(answer)})
            if n:
                results.append((ttft, total))
        return results

    def responses(self, base: list[dict[str, str]], turns: list[str]) -> list[tuple[float, float]]:
        results = []
        items: list[dict[str, Any]] = [_item(m["role"], m["content"]) for m in base]
        for n, text in enumerate([None, *turns]):
            if text is not None:
                items.append({"role": "user", "content": text})
            body = {"model": "tiny", "input": items, "stream": True, "max_output_tokens": self.output,
                    "ignore_eos": True, "temperature": 0}
            answer: list[str] = []
            start = time.perf_counter()
            with self.client.stream("POST", self.server.url + "/v1/responses", json=body) as response:
                ttft, total, _ = self._timed(start, _response_deltas(_checked(response), answer), bool)
            items.append(_item("assistant", "".join(answer)))
            if n:
                results.append((ttft, total))
        return results

    def websocket(self, base: list[dict[str, str]], turns: list[str], mode: str) -> list[tuple[float, float]]:
        from websockets.sync.client import connect

        results = []
        previous = None
        url, pid = self.fronts[mode]
        used = 0.0
        with connect(url.replace("http://", "ws://") + "/v1/responses", max_size=None) as ws:
            for n, text in enumerate([None, *turns]):
                cpu = cpu_seconds(pid)
                items = [_item(m["role"], m["content"]) for m in base] if text is None else [_item("user", text)]
                start = time.perf_counter()
                ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": items, "store": False,
                                    "previous_response_id": previous, "max_output_tokens": self.output,
                                    "temperature": 0}))
                ttft, total, last = self._timed(start, _ws_events(ws), lambda e: e["type"] == "response.output_text.delta")
                assert last["type"] in ("response.completed", "response.incomplete"), last
                previous = last["response"]["id"]
                if n:
                    results.append((ttft, total))
                    used += cpu_seconds(pid) - cpu
        self.cpu[mode] = used / len(results)
        return results


_FRONT = textwrap.dedent("""
    import sys, uvicorn
    from responses_cache import Route, StaticRouter, create_app, get_renderer
    from responses_cache_llamacpp import LlamaCppBackend
    url, gguf, port, history = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    renderer = get_renderer("gguf:" + gguf, history=history)
    backend = LlamaCppBackend(url, model="tiny", template=renderer, extra_body={"ignore_eos": True})
    route = Route(name="default", model="tiny", backend=backend, renderer=renderer, context_window=1 << 20)
    app = create_app(backend=backend, router=StaticRouter({"tiny": route}, default=route))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", ws_max_size=1 << 28)
""")


def _front(server: llamaproc.LlamaServer, gguf: Path, history: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    path = [str(_ROOT), str(_ROOT / "adapters" / "llamacpp"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.Popen([sys.executable, "-c", _FRONT, server.url, str(gguf), str(port), history], env=env)
    # uvicorn listens once the app's start-up (the renderer, the backend's handshake) is done
    if not wait_listening(proc, "127.0.0.1", port, 120):
        raise RuntimeError("the responses-cache front did not start")
    return proc, f"http://127.0.0.1:{port}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--history", type=int, nargs="+", default=[1000, 8000, 30000])
    parser.add_argument("--output", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--log", action="store_true", help="print the server's log of each run")
    parser.add_argument("--threads", type=int, default=1, help="llama-server's threads (default 1)")
    parser.add_argument("--keep", choices=["keep", "template"], nargs="+", default=["keep", "template"],
                        help="the renderer's history modes to run WebSocket mode with (keep: the sampled ids "
                             "of each answer stay in the log, as the floor sends them; template: the default)")
    parser.add_argument("--cuda", action="store_true", help="a CUDA build of llama-server, every layer on the GPU")
    parser.add_argument("--shape", choices=["tiny", "qwen3-0.6b"], default="tiny", help="the model's size (hf_model.py)")
    parser.add_argument("--source", type=Path, help="build llama.cpp from this llamaproc.pack_source archive")
    parser.add_argument("--python", type=Path,
                        help="the Python that builds and converts the model (torch, transformers); "
                             "default: the engine suite's vLLM environment")
    args = parser.parse_args(argv)
    from tests.tokens.hf_assets import real_model_dir

    python = args.python or vllmproc.provision()
    files = real_model_dir("qwen3")
    if files is None:
        raise SystemExit("Qwen3's tokenizer files cannot be had here (npm is missing)")
    architecture, model_name = ("Qwen2ForCausalLM", "tiny-qwen3-real") if args.shape == "tiny" else ("Qwen3ForCausalLM", args.shape)
    model = vllmproc.hf_models(python, {model_name: (files, architecture)}, shape=args.shape)[model_name]
    build = llamaproc.provision(cuda=args.cuda, source=args.source)
    gguf = llamaproc.gguf_model(build, python, model, model_name)
    context = max(args.history) + args.turns * (max(args.output) + 64) + 2048
    rows = []
    # One thread for the server by default: its threads spin while they wait, and on a small
    # machine the client and the responses-cache process need the rest.
    with llamaproc.LlamaServer(build, gguf, alias="tiny", slots=1, context=context, threads=args.threads,
                               extra_args=("--n-gpu-layers", "999") if args.cuda else (),
                               startup_timeout=300) as server:
        fronts = {mode: _front(server, gguf, mode) for mode in args.keep}
        try:
            def count(messages: list[dict[str, str]]) -> int:
                text = server.post("/apply-template", {"messages": messages})["prompt"]
                return len(server.post("/tokenize", {"content": text})["tokens"])
            for size in args.history:
                base = history(size, count)
                base_tokens = count(base)
                turns = [f"Turn {n}: what next?" for n in range(args.turns)]
                for output in args.output:
                    paths = Paths(server, {mode: (url, proc.pid) for mode, (proc, url) in fronts.items()}, output)
                    runs: dict[str, Callable[[list[dict[str, str]], list[str]], list[tuple[float, float]]]]
                    runs = {"floor": paths.floor}
                    runs.update({f"ws {mode}": functools.partial(paths.websocket, mode=mode) for mode in args.keep})
                    runs.update(chat=paths.chat, responses=paths.responses)
                    measured = {}
                    for name, run in runs.items():
                        before = len(server.evaluated())
                        times = run(base, turns)
                        evaluated = server.evaluated()[before:][-len(times):]  # the measured turns'
                        measured[name] = Measured(times, evaluated, paths.cpu.get(name[3:]))
                    rows.append((base_tokens, output, measured))
                    print(_row(*rows[-1]), flush=True)
                    if args.log:
                        print(server.tail(200), flush=True)
        except BaseException:
            print(f"llama-server's log ends:\n{server.tail(30)}", file=sys.stderr)
            raise
        finally:
            for front, _ in fronts.values():
                front.terminate()
                front.wait(30)
    print()
    print(_table(rows))
    return 0


class Measured:
    """One path's measured turns: (time to first token, turn time) each, in seconds, the prompt
    tokens the server evaluated for each, and (WebSocket mode) the responses-cache process's CPU
    seconds per turn."""

    def __init__(self, times: list[tuple[float, float]], evaluated: list[int], cpu: float | None = None) -> None:
        self.times, self.evaluated, self.cpu = times, evaluated, cpu

    @property
    def ttft(self) -> float:
        return statistics.median(t for t, _ in self.times)

    @property
    def turn(self) -> float:
        return statistics.median(w for _, w in self.times)

    @property
    def prompt(self) -> float:
        return statistics.median(self.evaluated) if self.evaluated else float("nan")


_NAMES = {"floor": "token ids", "ws keep": "responses-cache WS, keep", "ws template": "responses-cache WS, template",
          "chat": "chat, full history", "responses": "/v1/responses, full history"}


def _row(tokens: int, output: int, measured: dict[str, Measured]) -> str:
    floor = measured["floor"]
    cells = [f"{_NAMES[n]} {m.ttft * 1000:.1f}/{m.turn * 1000:.1f} ms (x{m.ttft / floor.ttft:.2f}/x{m.turn / floor.turn:.2f}; "
             f"turns {', '.join(f'{t * 1000:.1f}/{w * 1000:.1f}' for t, w in m.times)}; evaluated {m.evaluated}"
             + ("" if m.cpu is None else f"; CPU {m.cpu * 1000:.1f} ms/turn, {m.cpu / output * 1e6:.0f} us/token") + ")"
             for n, m in measured.items()]
    return f"history {tokens} tokens, {output} out: " + "; ".join(cells)


def _table(rows: list[tuple[int, int, dict[str, Measured]]]) -> str:
    names = [n for n in _NAMES if rows and n in rows[0][2]]
    head = ("| history | output | " + " | ".join(f"{_NAMES[n]}: TTFT / turn (ms) [evaluated]" for n in names)
            + " |\n\n(WebSocket mode's cells end with the responses-cache process's CPU time per turn.)\n")
    lines = [head, "|" + "---|" * (2 + len(names))]
    for tokens, output, measured in rows:
        floor = measured["floor"]
        cells = []
        for name in names:
            m = measured[name]
            ratio = "" if name == "floor" else f" (x{m.ttft / floor.ttft:.2f} / x{m.turn / floor.turn:.2f})"
            cpu = "" if m.cpu is None else f" CPU {m.cpu * 1000:.1f} ms"
            cells.append(f"{m.ttft * 1000:.1f} / {m.turn * 1000:.1f}{ratio} [{m.prompt:.0f}]{cpu}")
        lines.append(f"| {tokens} | {output} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
