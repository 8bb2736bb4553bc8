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
    ws = connect(url, max_size=None, max_queue=1)  # stops reading once one message waits
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
    ws.socket.close()
    return peak - before


def _send_all(frames: Callable[[int], str], count: int) -> Callable[[ClientConnection, threading.Event], None]:
    def push(ws: ClientConnection, stop: threading.Event) -> None:
        try:
            for i in range(count):
                if stop.is_set():
                    return
                ws.send(frames(i))
        except (OSError, Exception):  # the connection was dropped at the deadline
            return

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


def test_the_server_declines_compression(server: tuple[int, str]) -> None:
    """Compressed frames would bypass the bounds above: uvicorn inflates every frame of one socket
    read before it stops reading, and 4 MiB of ``y`` deflates to about 4 KiB, so one read could
    carry dozens of full-size messages (this module's flood grew the server by up to 263 MiB with
    compression on, twice its bound). The offer is declined."""
    _, url = server
    with connect(url, compression="deflate") as ws:
        assert ws.response is not None
        assert "Sec-WebSocket-Extensions" not in ws.response.headers
