"""What one client can make ``responses-cache serve`` hold, measured as the server process's resident
memory (``/proc``) over real loopback sockets: a client that never reads while its requests make
large events, and one that floods large frames, each raise the server's RSS by at most twice the
connection's documented budget (``docs/limits.md``: the frames its unfinished turns hold, the frame
being received, and its outbound events). The clients offer permessage-deflate, as
``websockets`` does by default; the server declines it (the last test).

Nothing is timed: the server's RSS is sampled while the client pushes, until the client has sent
everything or a deadline passes; a correct server stays under the bound however long it is watched."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from websockets.sync.client import ClientConnection, connect

from responses_cache.testing import serve_in_process

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from /proc")

MIB = 1024 * 1024
#: A connection's documented budget with the default settings: the frames its unfinished turns
#: hold (``max_queued_bytes``), the frame being received (``max_body_bytes``) and its outbound
#: events (``outbound_bytes``).
BUDGET = 32 * MIB + 16 * MIB + 1 * MIB
FRAME = 4 * MIB  # the frames a flooding client sends
WATCH_S = 5.0  # how long a client pushes at most (a deadline, not a measurement)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture  # one server per client: nothing left over from another test
def server() -> Iterator[tuple[int, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_CACHE_")}  # the defaults
    served = serve_in_process(env=env)
    try:
        url = served.ws_url
        # Warm up what every process builds once (tokenizer tables, the token-length table).
        with connect(url, max_size=None) as ws:
            for frame in (_big_frame(0), _echo_frame(0, generate=False)):
                ws.send(frame)
                while json.loads(ws.recv(timeout=60))["type"] not in ("response.completed", "error"):
                    pass
        yield served.proc.pid, url
    finally:
        served.kill()  # nothing to keep: no graceful drain of the connections that do not read


def _big_frame(i: int) -> str:
    """A large create on one of 30 lanes; refused (too many tokens) once its turn runs."""
    return json.dumps({"type": "response.create", "model": "sim-1", "stream_id": f"l{i % 30}", "input": "y" * FRAME})


#: Echoed in ``response.created``, ``response.in_progress`` and ``response.completed``.
_INSTRUCTIONS = ("All work and no play makes Jack a dull boy. " * 10_000)[:400_000]


def _echo_frame(i: int, *, generate: bool = True) -> str:
    """A turn whose events are large: its instructions come back three times."""
    return json.dumps({"type": "response.create", "model": "sim-1", "stream_id": f"l{i % 30}", "store": False,
                       "instructions": _INSTRUCTIONS, "input": "hi", "generate": generate})


def _peak_growth(pid: int, push: Callable[[ClientConnection, threading.Event], None], url: str) -> int:
    """The server's highest RSS above its starting point while ``push`` runs (on a connection
    that never reads), until it is done or ``WATCH_S`` has passed."""
    before = _rss(pid)
    stop = threading.Event()
    with connect(url, max_size=None, max_queue=1) as ws:  # stops reading once one message waits
        thread = threading.Thread(target=push, args=(ws, stop), daemon=True)
        thread.start()
        peak = before
        deadline = time.monotonic() + WATCH_S
        while thread.is_alive() and time.monotonic() < deadline:
            peak = max(peak, _rss(pid))
            thread.join(0.02)
        stop.set()
        ws.socket.shutdown(socket.SHUT_RDWR)  # a send blocked on the server fails now
        thread.join(30)
    return peak - before


def _send_all(
    frames: Callable[[int], str], count: int, *, then_wait: bool = False
) -> Callable[[ClientConnection, threading.Event], None]:
    """Send ``count`` frames; ``then_wait``: then keep the connection open (and unread) until the
    deadline, so that the server's work on what it took is watched to the end."""

    def push(ws: ClientConnection, stop: threading.Event) -> None:
        try:
            for i in range(count):
                if stop.is_set():
                    return
                ws.send(frames(i))
        except (OSError, Exception):  # the connection was dropped at the deadline
            return
        if then_wait:
            stop.wait()

    return push


def test_a_client_that_never_reads_large_events_holds_at_most_twice_its_budget(server: tuple[int, str]) -> None:
    pid, url = server
    # 400 turns x 3 echoes of 400 kB: 480 MB of events, were they all kept for it.
    growth = _peak_growth(pid, _send_all(_echo_frame, 400), url)
    assert growth <= 2 * BUDGET, f"RSS grew {growth / MIB:.1f} MiB"


def test_a_client_that_floods_large_frames_and_never_reads_holds_at_most_twice_its_budget(server: tuple[int, str]) -> None:
    pid, url = server
    growth = _peak_growth(pid, _send_all(_big_frame, 100), url)  # 400 MB
    assert growth <= 2 * BUDGET, f"RSS grew {growth / MIB:.1f} MiB"


#: The words of a text that is tokenized whole (one repeated letter would be refused before
#: tokenizing: see docs/limits.md, "Refused before tokenizing").
_WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards", "quietly",
    "judge", "boxing", "matches", "near", "Paris", "in", "1234", "and", "then", "5678", "more", "times", "def",
    "main(argv):", "return", "{'key':", "value}", "#", "comment",
]
_BLOCK = " ".join(random.Random(7).choice(_WORDS) for _ in range(12_000))  # ~64 kB
LARGE_FRAME = 8_000_000  # the frames of the client


def _prose_frame(i: int, size: int = LARGE_FRAME) -> str:
    """A create of about ``size`` bytes of words on one of 30 lanes: parsed, rendered and tokenized
    (about 1.7 million tokens), then refused as longer than the context window."""
    text = (_BLOCK * (size // len(_BLOCK) + 1))[: size - 120]
    return json.dumps({"type": "response.create", "model": "sim-1", "stream_id": f"l{i % 30}", "input": text})


@pytest.fixture
def unthrottled_server() -> Iterator[tuple[int, str]]:
    """``serve`` with the defaults but no input rate limit: a client's frames are taken as fast as
    it sends them, so only the memory bounds stand between it and the server's memory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_CACHE_")}
    env.update(RESPONSES_CACHE_INPUT_BYTES_PER_S="0", RESPONSES_CACHE_TENANT_INPUT_BYTES_PER_S="0")
    served = serve_in_process(env=env)
    try:
        url = served.ws_url
        # Warm up what every process builds once: tokenizer tables, the tokenizer's worker thread.
        with connect(url, max_size=None) as ws:
            for frame in (_big_frame(0), _prose_frame(0, 1_000_000), _echo_frame(0, generate=False)):
                ws.send(frame)
                while json.loads(ws.recv(timeout=60))["type"] not in ("response.completed", "error"):
                    pass
        yield served.proc.pid, url
    finally:
        served.kill()


#: What may stay once the client has gone: the allocator's own bookkeeping, not the client's data
#: (before the fix, 41-107 MiB stayed: the frames' decoded copies in the allocator's keeping).
LEFT_AFTER = 12 * MIB
SETTLE_S = 5.0  # how long the server may take to drop the connection's state (a deadline)


@pytest.mark.subprocess
def test_a_client_that_sends_8mb_frames_and_never_reads_holds_at_most_twice_its_budget_and_nothing_after(
    unthrottled_server: tuple[int, str],
) -> None:
    """The issue's client: 8 MB creates of text the server tokenizes, sent as fast as TCP takes
    them, never reading an answer. What the server holds for it (the frames of its accepted turns,
    their decoded input, their tokens, the frame being received) stays within twice the
    connection's budget; once it has gone, the server gives that memory back."""
    pid, url = unthrottled_server
    before = _rss(pid)
    growth = _peak_growth(pid, _send_all(_prose_frame, 40, then_wait=True), url)  # 320 MB
    assert growth <= 2 * BUDGET, f"RSS grew {growth / MIB:.1f} MiB"
    deadline = time.monotonic() + SETTLE_S
    while (left := _rss(pid) - before) > LEFT_AFTER and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left <= LEFT_AFTER, f"{left / MIB:.1f} MiB stayed after the client left"


def test_the_server_declines_compression(server: tuple[int, str]) -> None:
    """Compressed frames would bypass the bounds above: uvicorn inflates every frame of one socket
    read before it stops reading, and 4 MiB of ``y`` deflates to about 4 KiB, so one read could
    carry dozens of full-size messages (this module's flood grew the server by up to 263 MiB with
    compression on, twice its bound). The offer is declined."""
    _, url = server
    with connect(url, compression="deflate") as ws:
        assert ws.response is not None
        assert "Sec-WebSocket-Extensions" not in ws.response.headers
