"""The fault-injecting proxy itself: it forwards, and each fault does what its name says."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from tests.faultproxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(ConnectionResetError):  # the proxy's reset reaches this side too
            while data := self.request.recv(65536):
                self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with FaultProxy(server.server_address[1]) as proxy:
            yield proxy
    finally:
        server.shutdown()
        server.server_close()


def _connect(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=2)


def test_forwards_and_stalls_until_healed(proxy: FaultProxy) -> None:
    with _connect(proxy) as conn:
        conn.sendall(b"one")
        assert conn.recv(16) == b"one"
        proxy.stall()
        conn.sendall(b"two")
        conn.settimeout(0.3)
        with pytest.raises(TimeoutError):
            conn.recv(16)
        proxy.heal()
        conn.settimeout(2)
        assert conn.recv(16) == b"two"  # held, not lost


def test_reset_mid_stream_then_new_connections_work(proxy: FaultProxy) -> None:
    with _connect(proxy) as conn:
        conn.sendall(b"one")
        assert conn.recv(16) == b"one"
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            conn.sendall(b"two")
            conn.recv(16)
    with _connect(proxy) as conn:
        conn.sendall(b"three")
        assert conn.recv(16) == b"three"


def test_refuse_resets_and_refuses_until_healed(proxy: FaultProxy) -> None:
    conn = _connect(proxy)
    conn.sendall(b"one")
    assert conn.recv(16) == b"one"
    proxy.refuse()
    with pytest.raises(ConnectionResetError):
        conn.recv(16)
    conn.close()
    with pytest.raises(ConnectionRefusedError):
        _connect(proxy)
    proxy.heal()
    with _connect(proxy) as conn:
        conn.sendall(b"back")
        assert conn.recv(16) == b"back"
    assert proxy.accepted == 2
