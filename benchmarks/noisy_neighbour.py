"""Noisy neighbour: a normal client's turn times while another client sends the worst inputs.

Starts ``responses-cache serve`` (simulated engine, default limits) in a subprocess, then runs a
normal WebSocket client — a chained conversation, one ``response.create`` after another — twice,
side by side in one run:

* **quiet**: alone;
* **noisy**: while a second client (another tenant: its own API key), in its own threads, keeps
  sending what used to stall or pin the server: a 10 MB one-word input (tokenized to be refused ``context_length_exceeded``),
  distinct 8 MB tool lists on rejected requests, JSON nested 1,000 levels deep, ``tools`` entries
  that are not objects, invalid UTF-8, and WebSocket connections that queue large creates and
  never read.

It prints the normal client's p50/p90/p99 turn time in each run and the noisy/quiet ratios (the
goal: p99 at most 2x), a second quiet run afterwards (the machine's own noise), how many bad requests
the neighbour got answered, the server's CPU time and resident memory after each run, and how many
bytes of large WebSocket frames the neighbour got sent (``--set`` passes serve settings, e.g. the
input rate limits: ``--set tenant_input_bytes_per_s=0`` turns the tenant's off).

    python benchmarks/noisy_neighbour.py --turns 200
    python benchmarks/noisy_neighbour.py --retained 10     # what the neighbour leaves behind
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx
from websockets.sync.client import connect
from websockets.sync.connection import Connection

from responses_cache.testing import ServeProcess, serve_in_process

#: The two tenants: the normal client's key and the neighbour's.
NORMAL_KEY, NOISY_KEY = "sk-normal", "sk-noisy"


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _start_server(settings: dict[str, str] | None = None) -> ServeProcess:
    """``responses-cache serve`` with default limits (``settings``: ``RESPONSES_CACHE_*`` overrides)."""
    env = {**os.environ, "RESPONSES_CACHE_API_KEYS": f"{NORMAL_KEY},{NOISY_KEY}", **(settings or {})}
    return serve_in_process(env=env)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _turn(ws: Connection, body: dict[str, object]) -> dict[str, object]:
    ws.send(json.dumps({"type": "response.create", **body}))
    while True:
        event = json.loads(ws.recv(timeout=120))
        if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return dict(event)


def normal_client(url: str, turns: int) -> list[float]:
    """A chained conversation; the time of each turn (send to ``response.completed``)."""
    times: list[float] = []
    with connect(url, max_size=None, compression=None, additional_headers=_auth(NORMAL_KEY)) as ws:
        previous = None
        for i in range(turns):
            body: dict[str, object] = {"model": "sim-1", "input": f"step {i}: summarise the change", "store": False}
            if previous is not None:
                body["previous_response_id"] = previous
            started = time.perf_counter()
            event = _turn(ws, body)
            times.append(time.perf_counter() - started)
            assert event["type"] == "response.completed", event
            previous = event["response"]["id"]  # type: ignore[index]
    return times


class Neighbour:
    """The bad client: one thread per kind of bad HTTP request and one WebSocket thread, each
    looping until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.answered: dict[str, int] = {}
        self.unexpected: list[str] = []
        #: Open non-reading connections (dropped at the stop: their sends may wait on the server's
        #: input rate limit), and the bytes of the frames they got sent.
        self.hogs: set[Connection] = set()
        self.sent_bytes = 0
        deep = "[" * 1000 + "]" * 1000
        big_word = b"a" * (10 * 1024 * 1024)
        self.http_bodies: list[tuple[str, Callable[[int], bytes]]] = [
            ("10MB one word", lambda i: b'{"model":"sim-1","input":"' + big_word + b'"}'),
            ("8MB tools, rejected", lambda i: (
                b'{"model":"sim-1","input":"hi","previous_response_id":"resp_nope","tools":[{"type":"function","name":"f%d",'
                % i + b'"description":"' + b"x" * (8 * 1024 * 1024) + b'"}]}'
            )),
            ("deep nesting", lambda i: ('{"model":"sim-1","input":' + deep + '}').encode()),
            ("non-object tools", lambda i: b'{"model":"sim-1","input":"hi","tools":[1,"x",null,[]]}'),
            ("invalid UTF-8", lambda i: b'{"model":"sim-1","input":"\xff\xfe"}'),
        ]
        self.deep_frame = '{"type":"response.create","model":"sim-1","input":' + deep + '}'
        self.big_frame = json.dumps({"type": "response.create", "model": "sim-1", "input": "y" * (4 * 1024 * 1024)})

    def _count(self, name: str) -> None:
        self.answered[name] = self.answered.get(name, 0) + 1

    def http_loop(self, name: str, make: Callable[[int], bytes]) -> None:
        """One kind of bad HTTP request, sent again as soon as it is answered."""
        i = 0
        with httpx.Client(base_url=f"http://127.0.0.1:{self.port}/v1", timeout=120, headers=_auth(NOISY_KEY)) as client:
            while not self.stop.is_set():
                r = client.post("/responses", content=make(i), headers={"content-type": "application/json"})
                if r.status_code >= 500 or r.status_code < 400:
                    self.unexpected.append(f"{name}: HTTP {r.status_code}")
                self._count(name)
                i += 1
                self.stop.wait(0.05)

    def hog(self) -> None:
        """A connection that sends 20 large creates and never reads (its client stops taking
        frames once its queue is full), then drops the socket without a close handshake."""
        url = f"ws://127.0.0.1:{self.port}/v1/responses"
        hog = connect(url, max_size=None, compression=None, max_queue=1, additional_headers=_auth(NOISY_KEY))
        self.hogs.add(hog)
        try:
            for lane in range(20):
                if self.stop.is_set():
                    break
                hog.send(self.big_frame.replace('"type"', f'"stream_id":"l{lane}","type"', 1))
                self.sent_bytes += len(self.big_frame)
            self._count("unread 20 x 4MB creates (WebSocket)")
            self.stop.wait(5.0)
        except OSError:
            pass  # dropped by the stop below while a send waited on the server
        finally:
            self.hogs.discard(hog)
            hog.socket.close()  # abruptly: the server sees the connection drop

    def ws_loop(self) -> None:
        url = f"ws://127.0.0.1:{self.port}/v1/responses"
        hogs: list[threading.Thread] = []
        while not self.stop.is_set():
            # A new connection that never reads, in its own thread (its sends may block)...
            hogs = [h for h in hogs if h.is_alive()]
            if len(hogs) < 8:
                hog = threading.Thread(target=self.hog, daemon=True)
                hog.start()
                hogs.append(hog)
            # ...while another sends deeply nested frames and expects an error each time.
            with connect(url, max_size=None, additional_headers=_auth(NOISY_KEY)) as ws:
                for _ in range(20):
                    ws.send(self.deep_frame)
                    event = json.loads(ws.recv(timeout=120))
                    if event["type"] != "error" or event["status"] >= 500:
                        self.unexpected.append(f"deep nesting over WebSocket: {event['type']}")
                    self._count("deep nesting (WebSocket)")
            self.stop.wait(0.5)
        for open_hog in list(self.hogs):
            with contextlib.suppress(OSError):
                open_hog.socket.shutdown(socket.SHUT_RDWR)  # a send waiting on the server fails now
        for hog in hogs:
            hog.join(30)

    def run(self, only: str | None = None) -> list[threading.Thread]:
        threads: list[threading.Thread] = []
        if only in (None, "http"):
            threads += [threading.Thread(target=self.http_loop, args=kind, daemon=True) for kind in self.http_bodies]
        if only in (None, "ws"):
            threads.append(threading.Thread(target=self.ws_loop, daemon=True))
        for thread in threads:
            thread.start()
        return threads


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def neighbour_process(port: int, only: str | None) -> int:
    """Run as the neighbour (its own process, so its work never shares the measuring client's GIL)
    until stdin closes; then print what it got answered as JSON."""
    neighbour = Neighbour(port)
    threads = neighbour.run(only)
    sys.stdin.read()
    neighbour.stop.set()
    for thread in threads:
        thread.join(180)
    report = {"answered": neighbour.answered, "unexpected": neighbour.unexpected, "ws_sent_bytes": neighbour.sent_bytes}
    print(json.dumps(report), flush=True)
    return 0


def retained(seconds: float) -> int:
    """What the neighbour leaves behind: the server runs in this process, the neighbour in another;
    afterwards the process's RSS, before and after returning freed memory to the OS (glibc's
    ``malloc_trim``), Python's allocated blocks, and what the bounded structures hold."""
    import ctypes
    import gc

    from responses_cache import WebSocketMode, create_app
    from responses_cache.protocol.tools import tool_cache
    from responses_cache.testing import serve_in_thread
    from responses_cache.tokens import get_renderer
    from responses_cache.tokens.base import longest_token_within

    app = create_app()
    server = serve_in_thread(app)
    pid = os.getpid()
    # One-time, per-process tables (not per client): built before the baseline is taken.
    longest_token_within(get_renderer("harmony").encoding, b"x")
    gc.collect()
    before, blocks_before = _rss_mib(pid), sys.getallocatedblocks()
    proc = subprocess.Popen([sys.executable, __file__, "--neighbour", str(server.port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    time.sleep(seconds)
    proc.communicate(b"", timeout=300)
    time.sleep(2.0)  # let the last turns finish
    gc.collect()
    after, blocks_after = _rss_mib(pid), sys.getallocatedblocks()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    trimmed = _rss_mib(pid)
    mode = next(m for m in _middlewares(app) if isinstance(m, WebSocketMode))
    server.stop()
    print(f"server RSS: {before:.0f} MiB before, {after:.0f} MiB after {seconds:.0f} s of the neighbour, "
          f"{trimmed:.0f} MiB once freed memory is returned (malloc_trim)")
    print(f"Python allocated blocks: {blocks_before} before, {blocks_after} after")
    held = mode.input_budget.held if mode.input_budget is not None else 0
    print(f"held afterwards: tool cache {tool_cache.bytes_held} bytes, WebSocket input {held} bytes, "
          f"connections {mode.connections}, connection caches {mode.budget.total_bytes if mode.budget else 0} bytes")
    return 0


def _middlewares(app: object) -> list[object]:
    """The middleware instances of a built Starlette app (outermost first)."""
    found: list[object] = []
    node = getattr(app, "middleware_stack", None)
    while node is not None:
        found.append(node)
        node = getattr(node, "app", None)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=150, help="turns of the normal client per run")
    parser.add_argument("--neighbour", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=("http", "ws"), help="the neighbour's HTTP inputs only, or its WebSocket ones")
    parser.add_argument("--set", action="append", default=[], metavar="SETTING=VALUE",
                        help="a serve setting for the server (repeatable), e.g. --set tenant_input_bytes_per_s=4194304")
    parser.add_argument("--retained", type=float, metavar="SECONDS",
                        help="instead: run the neighbour this long against an in-process server and report what stays held")
    args = parser.parse_args(argv)
    if args.neighbour:
        return neighbour_process(args.neighbour, args.only)
    if args.retained:
        return retained(args.retained)
    settings = {"RESPONSES_CACHE_" + k.upper(): v for k, _, v in (item.partition("=") for item in args.set)}
    server = _start_server(settings)
    url, port, pid = server.ws_url, server.port, server.proc.pid
    try:
        normal_client(url, 10)  # warm up (tokenizer, caches)
        cpu = [_cpu_s(pid)]
        quiet = normal_client(url, args.turns)
        cpu.append(_cpu_s(pid))
        quiet_rss = _rss_mib(pid)
        noisy_proc = subprocess.Popen(
            [sys.executable, __file__, "--neighbour", str(port), *(["--only", args.only] if args.only else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        time.sleep(2.0)  # let the neighbour get going
        noisy_started = time.perf_counter()
        noisy = normal_client(url, args.turns)
        noisy_s = time.perf_counter() - noisy_started + 2.0
        cpu.append(_cpu_s(pid))
        out, _ = noisy_proc.communicate(b"", timeout=300)
        report = json.loads(out.decode().strip().splitlines()[-1])
        noisy_rss = _rss_mib(pid)
        again = normal_client(url, args.turns)  # the machine's own noise, for comparison
    finally:
        server.stop(30)
    print(f"normal client: {args.turns} chained WebSocket turns per run, simulated engine, {os.cpu_count()} CPUs")
    slow = 2 * _p(quiet, 99)
    print(f"{'run':<14}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}{'max ms':>10}   turns over 2x quiet p99")
    for name, times in (("quiet", quiet), ("noisy", noisy), ("quiet again", again)):
        over = sum(t > slow for t in times)
        print(f"{name:<14}{_p(times, 50) * 1000:>10.1f}{_p(times, 90) * 1000:>10.1f}{_p(times, 99) * 1000:>10.1f}"
              f"{max(times) * 1000:>10.1f}   {over}")
    print(f"noisy/quiet   {_p(noisy, 50) / _p(quiet, 50):>10.2f}{_p(noisy, 90) / _p(quiet, 90):>10.2f}"
          f"{_p(noisy, 99) / _p(quiet, 99):>10.2f}   (goal: p99 <= 2x)")
    print("neighbour's requests answered:", ", ".join(f"{k}: {v}" for k, v in sorted(report["answered"].items())))
    print(f"large WebSocket frames the server took from the neighbour: {report['ws_sent_bytes'] / 2**20:.0f} MiB "
          f"in {noisy_s:.1f} s")
    print(f"server CPU: {cpu[1] - cpu[0]:.1f} s in the quiet run, {cpu[2] - cpu[1]:.1f} s in the noisy run "
          f"(its {noisy_s:.1f} s, the neighbour's head start included)")
    print(f"server RSS after the quiet run {quiet_rss:.0f} MiB, after the noisy run {noisy_rss:.0f} MiB")
    if report["unexpected"]:
        print("UNEXPECTED:", *report["unexpected"][:10], sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
