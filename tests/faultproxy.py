"""A fault-injecting TCP proxy for the tests: loopback connections forwarded to a target, and on
command the faults a network or a crashing peer gives a client.

* :meth:`FaultProxy.stall`: connections stay open, nothing more is forwarded either way (a hung
  engine, a black-holed route); new connections are accepted and stall too.
* :meth:`FaultProxy.reset`: every open connection is reset (``SO_LINGER`` 0, then close: the peer
  reads ``ECONNRESET``), mid-stream or idle.
* :meth:`FaultProxy.refuse`: open connections are reset and the listening socket closed, so a new
  connection is refused (a stopped engine).
* :meth:`FaultProxy.heal`: forwarding again, listening again on the same port.

Threads, not asyncio: the proxy runs beside whatever event loop the test drives. A test-only
helper (the layout keeps test fixtures in ``tests/``; see ``tests/store/nginx_proxy.py``)."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from types import TracebackType

#: ``SO_LINGER`` on, 0 s: ``close()`` sends RST instead of FIN.
_RESET_LINGER = struct.pack("ii", 1, 0)


class _Pipe:
    """One client connection and its upstream connection, copied both ways by one thread."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.closed = False
        #: Set while the pipe holds still (stalled): once set, nothing more is forwarded.
        self.paused = threading.Event()
        self.thread = threading.Thread(target=self._run, name="faultproxy-pipe", daemon=True)

    def _run(self) -> None:
        peers = {self.client: self.upstream, self.upstream: self.client}
        try:
            while not self.closed:
                if self.proxy.stalled.is_set():
                    self.paused.set()  # what stall() waits for
                    time.sleep(0.02)  # the bytes wait in the kernel's buffers: nothing moves
                    continue
                self.paused.clear()
                readable, _, _ = select.select(list(peers), [], [], 0.05)
                if self.proxy.stalled.is_set():
                    continue  # stalled while waiting: what arrived stays where it is
                for source in readable:
                    data = source.recv(65536)
                    if not data:
                        return  # an orderly close on one side: close both
                    peers[source].sendall(data)
        except (OSError, ValueError):  # ValueError: a socket closed by reset() meanwhile
            return
        finally:
            self.close(reset=False)

    def close(self, *, reset: bool) -> None:
        if self.closed and not reset:
            return
        self.closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_LINGER)
                sock.close()
        self.proxy._forget(self)


class FaultProxy:
    """``with FaultProxy(port) as proxy: proxy.url`` — forwards ``127.0.0.1:proxy.port`` to
    ``127.0.0.1:target_port``. :attr:`accepted` counts the connections it took."""

    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.accepted = 0
        self.stalled = threading.Event()
        self._listener: socket.socket | None = None
        self._pipes: set[_Pipe] = set()
        self._lock = threading.Lock()
        self._acceptor: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._listen()
        return self

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, args=(listener,), name="faultproxy", daemon=True)
        self._acceptor.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed: refusing, or stopped
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_LINGER)
                client.close()
                continue
            upstream.settimeout(None)
            pipe = _Pipe(self, client, upstream)
            with self._lock:
                self.accepted += 1
                self._pipes.add(pipe)
            pipe.thread.start()

    def _forget(self, pipe: _Pipe) -> None:
        with self._lock:
            self._pipes.discard(pipe)

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        with self._lock:
            return len(self._pipes)

    def stall(self) -> None:
        """Stop forwarding; connections stay open. Returns once every open connection holds
        still (a byte sent after it returns is not forwarded)."""
        self.stalled.set()
        with self._lock:
            pipes = list(self._pipes)
        for pipe in pipes:
            pipe.paused.wait(1.0)  # a pipe closing meanwhile never pauses: bounded

    def reset(self) -> None:
        """Reset every open connection (both sides get RST)."""
        with self._lock:
            pipes = list(self._pipes)
        for pipe in pipes:
            pipe.close(reset=True)

    def refuse(self) -> None:
        """Reset every open connection and stop listening: new connections are refused."""
        listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown wakes the acceptor blocked in accept(); close frees the port
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            if self._acceptor is not None:
                self._acceptor.join(5)
        self.reset()

    def heal(self) -> None:
        """Forward again, and listen again (same port) if refusing."""
        self.stalled.clear()
        if self._listener is None:
            self._listen()

    def stop(self) -> None:
        self.stalled.clear()
        self.refuse()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
