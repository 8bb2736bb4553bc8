"""``responses-cache serve``'s connection limits on real sockets: a connection that never sends a
complete request head is closed, idle keep-alive connections are closed, WebSockets are not, and
past the connection cap new requests get 503."""

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
from websockets.sync.client import connect

from responses_cache import SimulatedConfig, SimulatedEngine, create_app
from responses_cache.serving import ConnectionLimits, uvicorn_config
from responses_cache.websocket import WebSocketMode


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
    for _ in range(200):
        if instance.started:
            break
        time.sleep(0.05)
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


def test_websockets_outlive_the_header_timeout_and_the_cap_answers_503(server: tuple[str, int]) -> None:
    host, port = server
    url = f"ws://{host}:{port}/v1/responses"
    with connect(url) as first, connect(url) as second:
        time.sleep(0.6)  # past the header timeout: an upgraded connection is not affected
        for ws in (first, second):
            ws.send('{"type":"response.create","model":"sim-1","input":"hi"}')
            while True:
                event = ws.recv(timeout=10)
                if '"response.completed"' in event:
                    break
        with connect(url) as third:
            third.send('{"type":"response.create","model":"sim-1","input":"hi"}')
            assert third.recv(timeout=10)
            # four connections are open now (three WebSockets and this one): past the cap of three
            r = httpx.get(f"http://{host}:{port}/v1/models", timeout=10)
            assert r.status_code == 503


def _frame(text: str) -> bytes:
    """A masked client text frame."""
    payload = text.encode()
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    n = len(payload)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    return head + mask + masked


def test_a_websocket_peer_that_stops_reading_loses_its_socket() -> None:
    """The app aborts the connection when a write waits too long (its state is freed), and the
    TCP connection itself is then aborted: nothing of the peer stays held by the server."""
    engine = SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=3_000))
    app = create_app(backend=engine, write_timeout_s=0.3)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    limits = ConnectionLimits(ws_linger_s=0.3)
    instance = uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=port, limits=limits, log_level="warning"))
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    for _ in range(200):
        if instance.started:
            break
        time.sleep(0.05)
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16))
        sock.sendall(b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert b" 101 " in head
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
        sock.close()
    finally:
        instance.should_exit = True
        thread.join(10)
