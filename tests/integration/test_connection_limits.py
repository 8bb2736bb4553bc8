"""``responses-cache serve``'s connection limits on real sockets: a connection that never sends a
complete request head is closed, idle keep-alive connections are closed, WebSockets are not, past
the connection cap new requests and upgrades get 503, and a WebSocket peer that stops reading loses
its TCP connection to an abortive close (RST).

Nothing here is timed: every wait has a deadline, and what happens in between is ordered by what
the server did (a connection it closed, a counter it moved)."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from responses_cache import SimulatedConfig, SimulatedEngine, create_app
from responses_cache.edge.websocket import WebSocketMode
from responses_cache.server.serving import ConnectionLimits, uvicorn_config


def _wait_started(instance: uvicorn.Server, thread: threading.Thread) -> None:
    deadline = time.monotonic() + 15
    while not instance.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)


def _protocols() -> list[Any]:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    found: list[Any] = [H11Protocol]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is optional (uvicorn[standard])
        return found
    return [*found, HttpToolsProtocol]


@pytest.fixture(params=_protocols(), ids=lambda p: p.__name__)
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=2)))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    limits = ConnectionLimits(header_timeout_s=0.3, keep_alive_s=1, max_connections=3)
    config = uvicorn_config(app, host="127.0.0.1", port=port, limits=limits, protocol=request.param, log_level="warning")
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    _wait_started(instance, thread)
    yield "127.0.0.1", port
    instance.should_exit = True
    thread.join(10)


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(15)  # a safety net: the server closes long before
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("sent", [b"", b"GET /v1/models HT", b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n"])
def test_an_incomplete_request_head_is_closed(server: tuple[str, int], sent: bytes) -> None:
    with socket.create_connection(server) as sock:
        if sent:
            sock.sendall(sent)
        assert _closed_by_server(sock)


def test_an_idle_keep_alive_connection_is_closed(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(15)
        assert b"200 OK" in sock.recv(65536)
        assert _closed_by_server(sock)


def _completes(ws: Any) -> bool:
    ws.send('{"type":"response.create","model":"sim-1","input":"hi"}')
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if '"response.completed"' in ws.recv(timeout=10):
            return True
    return False


def test_a_websocket_outlives_the_header_timeout(server: tuple[str, int]) -> None:
    host, port = server
    with connect(f"ws://{host}:{port}/v1/responses") as ws:
        # A connection made after the upgrade is closed by the header timeout: the WebSocket's
        # own (it connected first) would have fired by then.
        with socket.create_connection(server) as later:
            assert _closed_by_server(later)
        assert _completes(ws)


def test_past_the_cap_upgrades_and_requests_get_503(server: tuple[str, int]) -> None:
    """The cap (three) counts WebSockets and refuses upgrades too, by uvicorn's rule for requests:
    a request or an upgrade that would make three connections open (its own included) gets 503."""
    host, port = server
    url = f"ws://{host}:{port}/v1/responses"
    with connect(url) as first, connect(url) as second:
        with pytest.raises(InvalidStatus) as refused:
            connect(url)
        assert refused.value.response.status_code == 503
        assert httpx.get(f"http://{host}:{port}/v1/models", timeout=10).status_code == 503
        assert _completes(first) and _completes(second)  # the ones admitted are served
    deadline = time.monotonic() + 15  # the server notices the two closes; then one is admitted again
    while True:
        try:
            with connect(url) as again:
                assert _completes(again)
            break
        except InvalidStatus:
            assert time.monotonic() < deadline


def _frame(text: str | bytes, opcode: int = 0x1) -> bytes:
    """A masked client frame (text by default)."""
    payload = text.encode() if isinstance(text, str) else text
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    n = len(payload)
    head = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    return head + mask + masked


def _upgrade(port: int, rcvbuf: int | None = None) -> socket.socket:
    """A raw WebSocket client socket, upgraded (the 101 read, nothing more)."""
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(15)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16))
    sock.sendall(b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert b" 101 " in head
    return sock


def test_a_peer_that_takes_everything_gets_an_orderly_close(server: tuple[str, int]) -> None:
    """The abortive close is only for a peer that left bytes untaken: one that reads the close
    frame and answers it gets FIN (an end of stream), never RST."""
    sock = _upgrade(server[1])
    with sock:
        sock.sendall(_frame(b"\x00", opcode=0x2))  # binary frames are not part of the protocol: close 1003
        received = b""
        while b"\x88\x02\x03\xeb" not in received:  # the server's close frame (unmasked, code 1003)
            chunk = sock.recv(4096)
            assert chunk, received
            received += chunk
        sock.sendall(_frame(b"\x03\xeb", opcode=0x8))  # the close handshake answered
        assert sock.recv(4096) == b""  # ConnectionResetError here would be an abortive close


def test_a_websocket_peer_that_stops_reading_loses_its_socket() -> None:
    """The app aborts the connection when a write waits too long (its state is freed), and the
    TCP connection itself is then aborted (RST): the kernel drops what it still held for the peer,
    so the peer, reading at last, gets ECONNRESET, not the rest of the stream and an orderly end."""
    engine = SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=3_000))
    app = create_app(backend=engine, write_timeout_s=0.3)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    limits = ConnectionLimits(ws_linger_s=0.3)
    instance = uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=port, limits=limits, log_level="warning"))
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    _wait_started(instance, thread)
    try:
        sock = _upgrade(port, rcvbuf=4096)
        for lane in range(8):  # far more output than the socket buffers hold; never read
            sock.sendall(_frame(json.dumps({"type": "response.create", "model": "sim-1", "input": "go", "stream_id": f"l{lane}"})))
        deadline = time.monotonic() + 30  # a safety net; the server lets go long before
        while instance.server_state.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not instance.server_state.connections  # the socket is gone on the server's side
        node = app.middleware_stack
        while not isinstance(node, WebSocketMode):
            node = node.app
        assert node.aborted == 1 and node.connections == 0
        assert node.input_budget is not None and node.input_budget.held == 0
        sock.settimeout(15)
        with pytest.raises(ConnectionResetError):
            while sock.recv(65536):  # an orderly close would hand over megabytes, then b""
                pass
        sock.close()
    finally:
        instance.should_exit = True
        thread.join(10)
