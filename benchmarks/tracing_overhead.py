"""Tracing overhead: per-turn time with OpenTelemetry tracing configured against without, side by
side in one run.

Servers run the same WebSocket agent loop (every turn continues the previous one with a
tool output of ``--tokens-per-turn`` tokens; a new conversation every ``--conversation-turns``),
each in its own process. Each round the client takes ``--burst`` back-to-back turns on each
server, the servers in a random order, so machine noise hits them alike, and compares each turn
with the untraced server's turn at the same place of the same round (a paired ratio). The first
turn of a burst is not counted: it follows another server's answer, and a traced server's work
after its answer (its spans) would land on it; the turns counted follow their own server's
previous turn, as a client's do. A server process has a speed of its own that lasts as long as it
does (where its memory landed, which core it shares with what): two identical untraced servers
can differ by several percent for a whole run. So the run is ``--blocks`` blocks, each with fresh
server processes, and the figures are pooled over blocks:

* per mode, the median of the paired ratios over every turn of every block, with a 95%
  bootstrap interval that resamples blocks and then turns within them (so it covers both the
  process-to-process and the turn-to-turn noise), and the spread of the per-block medians;
* ``off-again``, a second untraced server in every block (an A/A control): its ratio is what
  two servers differing in nothing show, the noise floor a traced mode's ratio is read against;
* the server's CPU time per turn, over the untraced server's in the same block (median of the
  blocks).

The modes:

* ``off``: no tracer (the default: the seam's do-nothing span);
* ``api``: :class:`~responses_cache.observability.otel.OpenTelemetryTracer` over the OpenTelemetry API with no
  SDK configured (what ``--otel`` costs where nothing collects);
* ``sdk``: the SDK with a batch span processor whose exporter encodes every span as OTLP protobuf
  and drops the bytes (the work of exporting, without a collector on the network);
* ``sdk-start-span``: ``sdk`` with a second span processor that does nothing (the SDK's base
  ``SpanProcessor``): the tracer then makes every span through ``Tracer.start_span``, as it does
  for any processor but the SDK's batch and simple ones (``sdk`` makes its stage spans finished);
* ``sdk-no-export``: ``sdk`` with an exporter that drops each batch without encoding it (the
  tracer's and the SDK's work without the exporter's: the rest of ``sdk``'s cost is the export);
* ``sdk+metrics``: ``sdk``, plus OpenTelemetry metrics alongside Prometheus (``serve --otel``);
* ``sdk-sampled``: ``sdk`` with a 10% sampler (``ParentBased(TraceIdRatioBased(0.1))``);
* ``sdk-lean``: ``sdk`` with a span for the engine call only (``stages={"engine"}``), the other
  stages timed as attributes of the turn span.

Two engines: ``zero`` (zero latency: the turn time is all API overhead, the worst case for a
ratio) and ``real`` (``--tokens-per-s`` output tokens per second, as a fast engine streams).
Every server exports Prometheus metrics; ``--scrape DIR`` saves the ``sdk`` server's exposition
every ``--scrape-every`` seconds (zero-latency engine only) for :mod:`benchmarks.dashboard`.

    python -m benchmarks.tracing_overhead --engine zero --modes sdk,sdk-start-span --turns 2560 --blocks 40 --json out.json

``--turns`` is the number of turns per server in all (split over the blocks), as it was before
blocks and bursts (then one turn per server per round). ``--before DIR`` (a checkout of an earlier
commit, e.g. ``git archive HEAD~1 | tar -x -C DIR``) adds modes ``MODE-before``: that tree's
``MODE`` server, measured side by side with this tree's in the same blocks.

Needs the ``bench`` extra (the OpenTelemetry SDK and OTLP encoding).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import websockets

from benchmarks.suite.footprint import cpu_seconds
from benchmarks.suite.server import stop_process
from benchmarks.suite.workload import code_text

MODES = ("off", "api", "sdk", "sdk-start-span", "sdk-no-export", "sdk+metrics", "sdk-sampled", "sdk-lean")
#: The A/A control: a second untraced server, in every block.
CONTROL = "off-again"
#: A mode served from the ``--before`` checkout (``sdk-before``: that tree's ``sdk``).
BEFORE = "-before"
_ROOT = Path(__file__).resolve().parents[1]


# -- the server (a child process) ---------------------------------------------------------------


def _serve(mode: str, engine: str, tokens_per_s: float) -> None:
    import tempfile

    import uvicorn

    from responses_cache import Biller, JsonlSink, MetricsTee, PrometheusMetrics, create_app
    from responses_cache.backends.simulated import Scenario, SimulatedConfig, SimulatedEngine

    rate = tokens_per_s if engine == "real" else 1e12
    backend = SimulatedEngine(
        SimulatedConfig(
            instant=False, prefill_tokens_per_s=1e12, output_tokens_per_s=rate,
            scenario=Scenario(tool_calls=1_000_000, argument_tokens=40, answer_tokens=24),
        )
    )
    prometheus = PrometheusMetrics()
    metrics: Any = prometheus
    tracer = None
    if mode not in ("off", CONTROL):
        from responses_cache.observability.otel import OpenTelemetryMetrics, OpenTelemetryTracer

        provider = meter_provider = None
        if mode.startswith("sdk"):
            provider, meter_provider = _sdk(
                sampled=mode == "sdk-sampled", start_span=mode == "sdk-start-span", encode=mode != "sdk-no-export"
            )
        tracer = OpenTelemetryTracer(provider, stages={"engine"} if mode == "sdk-lean" else None)
        if mode == "sdk+metrics":
            metrics = MetricsTee(prometheus, OpenTelemetryMetrics(meter_provider))
    # Billing with a journal, as a production server has it (a span per journal write when traced).
    spool = Path(tempfile.mkdtemp(prefix="tracing-overhead-"))
    billing = Biller(JsonlSink(spool / "usage.jsonl"), journal_path=spool / "journal")
    app = create_app(backend=backend, metrics=metrics, tracer=tracer, billing=billing, context_window=1 << 22)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", ws_max_size=1 << 26)
    server = uvicorn.Server(config)

    async def run() -> None:
        task = asyncio.ensure_future(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        print(f"PORT {port}", flush=True)
        await task

    asyncio.run(run())


def _sdk(sampled: bool = False, start_span: bool = False, encode: bool = True) -> tuple[Any, Any]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Encoding(SpanExporter):
        """Encodes each batch as an OTLP request, as the OTLP exporters do, and drops it."""

        def __init__(self) -> None:
            self.bytes = 0

        def export(self, spans: Any) -> SpanExportResult:
            if encode:
                self.bytes += len(encode_spans(spans).SerializeToString())
            return SpanExportResult.SUCCESS

    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1))) if sampled else TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Encoding()))
    if start_span:
        provider.add_span_processor(SpanProcessor())
    return provider, MeterProvider(metric_readers=[InMemoryMetricReader()])


# -- the client ---------------------------------------------------------------------------------


class Server:
    """A server process (``start``), then its port (``ready``): a block's servers start together.
    ``root``: the source tree it runs (``--before``: another checkout's), this one's by default."""

    def __init__(self, mode: str, engine: str, tokens_per_s: float, root: Path = _ROOT) -> None:
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        self.mode = mode
        self.port = 0
        served = mode.removesuffix(BEFORE)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.tracing_overhead", "--serve", served, "--engine", engine, "--tokens-per-s", str(tokens_per_s)],
            stdout=subprocess.PIPE, text=True, env=env, cwd=root,
        )

    def ready(self) -> Server:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            stop_process(self.proc)
            raise RuntimeError(f"the {self.mode} server did not start: {line!r}")
        self.port = int(line.split()[1])
        return self

    def cpu_seconds(self) -> float:
        """CPU time the server process's threads have used (:func:`footprint.cpu_seconds`)."""
        return cpu_seconds(self.proc.pid)

    def scrape(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as reply:
            return str(reply.read().decode())

    def stop(self) -> None:
        stop_process(self.proc)


async def _turn(ws: Any, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    await ws.send(json.dumps({"type": "response.create", **body}))
    while True:
        event = json.loads(await ws.recv())
        if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            if event["type"] != "response.completed":
                raise RuntimeError(f"turn ended with {event}")
            return time.perf_counter() - start, event["response"]


async def _loop(
    servers: list[Server], rounds: int, burst: int, tokens_per_turn: int, per_conversation: int, tick: float,
    scrape: Path | None, seed: int = 0,
) -> dict[str, list[float]]:
    """``rounds`` rounds of ``burst`` back-to-back turns on each server, the servers in a random
    order each round (a fixed order would have the same server always follow the same other).
    A server's turn right after another server's answer can pay for that server's work after
    its answer (a traced server makes its spans then), so the first turn of each burst is not
    counted: the turns counted follow their own server's previous turn, as a client's do. Every
    server takes the same turns, so the lists line up turn for turn across servers."""
    rng = random.Random(seed)
    times: dict[str, list[float]] = {s.mode: [] for s in servers}
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
    conns = [await websockets.connect(f"ws://127.0.0.1:{s.port}/v1/responses", max_size=None, compression=None) for s in servers]
    previous: list[dict[str, Any] | None] = [None] * len(servers)
    last_scrape = time.monotonic()
    traced = next((s for s in servers if s.mode == "sdk"), None)
    try:
        for k in range(rounds):
            for i in rng.sample(range(len(servers)), len(servers)):
                for j in range(burst):
                    n = k * burst + j  # this server's turn number
                    body: dict[str, Any] = {"model": "sim-1", "tools": tools, "store": False}
                    before = previous[i] if n % per_conversation else None  # a new conversation now and then
                    if before is None:
                        body["input"] = "The test suite fails in src/parser: find the cause and fix it."
                    else:
                        call = before["output"][-1]
                        body["previous_response_id"] = before["id"]
                        body["input"] = [{"type": "function_call_output", "call_id": call["call_id"], "output": code_text(tokens_per_turn, n)}]
                    seconds, previous[i] = await _turn(conns[i], body)
                    if n >= 3 and n % per_conversation and (j or burst == 1):  # warm-up, first turns, switches aside
                        times[servers[i].mode].append(seconds)
                await asyncio.sleep(0.002)
            if scrape is not None and traced is not None and time.monotonic() - last_scrape >= tick:
                last_scrape = time.monotonic()
                (scrape / f"{time.time():.3f}.prom").write_text(traced.scrape())
    finally:
        for ws in conns:
            await ws.close()
    return times


def seam_cost_ns(turns: int = 200_000) -> float:
    """Nanoseconds per turn of the tracing seam's calls when nothing traces (the default): one
    turn span, the stages a traced turn with a hook and a journal opens, the engine's trace
    context, and the end — what the pipeline calls whether or not a tracer is configured."""
    from responses_cache.observability.tracing import NO_TRACER

    stages = ("resolve", "validate", "hook patterns", "render", "engine", "engine.first_token", "journal.open", "journal.close")
    carrier: dict[str, str] = {}
    attributes = {"responses_cache.tenant": "t"}
    start = time.perf_counter_ns()
    for _ in range(turns):
        span = NO_TRACER.start_turn(carrier, attributes)
        for name in stages:
            with span.stage(name) as stage:
                pass
        span.inject(stage)
        span.set("responses_cache.parent_tier", "connection")
        if span.recording:
            pass
        span.end("completed")
    return (time.perf_counter_ns() - start) / turns


def _bootstrap_median(blocks: list[list[float]], resamples: int = 1000) -> tuple[float, float]:
    """A 95% interval for the median of the pooled ``blocks``: each resample draws blocks with
    replacement, then values with replacement within each block drawn."""
    rng = random.Random(0)
    medians = []
    for _ in range(resamples):
        pool: list[float] = []
        for block in rng.choices(blocks, k=len(blocks)):
            pool.extend(rng.choices(block, k=len(block)))
        medians.append(statistics.median(pool))
    medians.sort()
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def _summary(blocks: list[dict[str, list[float]]], cpu: list[dict[str, float]]) -> dict[str, Any]:
    """Per mode, pooled over the blocks: per-turn times, the paired ratios to ``off`` (each turn
    over the untraced turn of its round) with a bootstrap interval and the per-block medians, and
    server CPU per turn over ``off``'s in the same block."""
    out: dict[str, Any] = {}
    for mode in blocks[0]:
        values = [v for block in blocks for v in block[mode]]
        base = [v for block in blocks for v in block["off"]]
        paired = [[v / o for v, o in zip(block[mode], block["off"], strict=True)] for block in blocks]
        per_block = [statistics.median(r) for r in paired]
        low, high = _bootstrap_median(paired)
        cpu_ratios = [c[mode] / c["off"] for c in cpu]
        q1, q3 = _quartiles(per_block)
        out[mode] = {
            "turns": len(values),
            "median_ms": round(statistics.median(values) * 1000, 3),
            "mean_ms": round(statistics.fmean(values) * 1000, 3),
            "ratio_median": round(statistics.median(values) / statistics.median(base), 4),
            "ratio_mean": round(statistics.fmean(values) / statistics.fmean(base), 4),
            # The estimate: the median of each turn over the untraced turn of the same round.
            "ratio_paired": round(statistics.median(r for block in paired for r in block), 4),
            "ratio_paired_ci95": [round(low, 4), round(high, 4)],
            "ratio_paired_blocks": [round(r, 4) for r in per_block],
            "ratio_paired_blocks_iqr": [round(q1, 4), round(q3, 4)],
            "server_cpu_ms_per_turn": round(statistics.median(c[mode] for c in cpu) * 1000, 3),
            "cpu_ratio": round(statistics.median(cpu_ratios), 4),
            "cpu_ratio_blocks": [round(r, 4) for r in cpu_ratios],
        }
    return out


def _block(
    modes: list[str], engine: str, args: argparse.Namespace, rounds: int, scrape: Path | None, seed: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """One block: fresh server processes, ``rounds`` rounds; per-turn times and CPU per turn."""
    servers = [
        Server(mode, engine, args.tokens_per_s, args.before if mode.endswith(BEFORE) else _ROOT) for mode in modes
    ]
    try:
        for server in servers:
            server.ready()
        cpu = [s.cpu_seconds() for s in servers]
        times = asyncio.run(
            _loop(servers, rounds, args.burst, args.tokens_per_turn, args.conversation_turns, args.scrape_every, scrape, seed)
        )
        used = {s.mode: (s.cpu_seconds() - before) / (rounds * args.burst) for s, before in zip(servers, cpu, strict=True)}
    finally:
        for server in servers:
            server.stop()
    return times, used


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", choices=(*MODES, CONTROL), help=argparse.SUPPRESS)
    parser.add_argument("--modes", default=",".join(MODES), help="which of " + ",".join(MODES) + " to run (off and off-again always)")
    parser.add_argument("--engine", choices=("zero", "real", "both"), default="both")
    parser.add_argument("--tokens-per-s", type=float, default=1000.0, help="the real engine's output rate")
    parser.add_argument("--turns", type=int, default=200, help="turns per server in all (split over the blocks)")
    parser.add_argument("--blocks", type=int, default=20, help="blocks of rounds, each on fresh server processes")
    parser.add_argument("--burst", type=int, default=8, help="back-to-back turns per server in a round (the first not counted)")
    parser.add_argument("--tokens-per-turn", type=int, default=500, help="tokens of tool output per turn")
    parser.add_argument("--conversation-turns", type=int, default=50, help="turns per conversation (then a new one)")
    parser.add_argument("--scrape", type=Path, help="save the sdk server's /metrics here during the run")
    parser.add_argument("--scrape-every", type=float, default=1.0)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--before", type=Path,
        help="a checkout of an earlier commit (git archive or worktree): MODE-before in --modes runs its MODE server, side by side",
    )
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve, args.engine, args.tokens_per_s)
        return 0
    results: dict[str, Any] = {"options": {k: str(v) for k, v in vars(args).items()}}
    results["seam_ns_per_turn"] = round(seam_cost_ns(), 1)
    print(f"the tracing seam, nothing configured: {results['seam_ns_per_turn']:.0f} ns per turn", file=sys.stderr)
    rounds = max(2, args.turns // (max(1, args.blocks) * max(1, args.burst)))
    for engine in ("zero", "real") if args.engine == "both" else (args.engine,):
        wanted = dict.fromkeys(args.modes.split(","))
        modes = ["off", CONTROL, *(m for m in wanted if m.removesuffix(BEFORE) in MODES and m != "off" and (args.before or m in MODES))]
        scrape = args.scrape if engine == "zero" else None
        if scrape is not None:
            scrape.mkdir(parents=True, exist_ok=True)
        blocks: list[dict[str, list[float]]] = []
        cpu: list[dict[str, float]] = []
        for b in range(max(1, args.blocks)):
            # Which process gets which mode changes from block to block (the start order too).
            times, used = _block(modes[b % len(modes):] + modes[: b % len(modes)], engine, args, rounds, scrape, b)
            blocks.append({m: times[m] for m in modes})
            cpu.append(used)
            print(f"  engine={engine} block {b + 1}/{args.blocks}: paired x off " + ", ".join(
                f"{m} {statistics.median(v / o for v, o in zip(times[m], times['off'], strict=True)):.3f}" for m in modes[1:]
            ), file=sys.stderr)
        results[engine] = _summary(blocks, cpu)
        print(f"engine={engine} ({len(blocks)} blocks of {rounds} rounds of {args.burst} turns per server):", file=sys.stderr)
        for mode, row in results[engine].items():
            low, high = row["ratio_paired_ci95"]
            q1, q3 = row["ratio_paired_blocks_iqr"]
            print(f"  {mode:>11}: median {row['median_ms']:.3f} ms  x{row['ratio_paired']:.3f} paired "
                  f"(95% CI {low:.3f}-{high:.3f}; blocks IQR {q1:.3f}-{q3:.3f})  x{row['ratio_median']:.3f} (medians)  "
                  f"server CPU {row['server_cpu_ms_per_turn']:.3f} ms/turn x{row['cpu_ratio']:.3f}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
