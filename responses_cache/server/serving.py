"""Running an app under uvicorn with every connection limit set (see ``docs/limits.md``).

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and answers 503 past a
concurrency cap (``limit_concurrency``), but three gaps are left, which this module's protocols
close:

* a connection that never completes a request's headers (a bare TCP connect, a request line sent
  byte by byte) gets all the time it wants. :func:`header_timeout_protocol` adds that timeout to
  uvicorn's HTTP protocol (httptools or h11, as uvicorn would choose): a connection that has not
  completed a request's headers within ``header_timeout_s`` of connecting (or of its previous
  response) is closed;
* the concurrency cap is checked for HTTP requests only: a WebSocket upgrade is never refused. The
  same protocol refuses an upgrade with 503 by the same rule uvicorn applies to a request;
* a WebSocket peer that stops reading keeps its socket, and the bytes queued for it, for as long
  as the kernel lets it, even after the server closed its side (an orderly close waits for the
  data to be taken). :func:`linger_abort_protocol` gives it ``linger_s`` to take them and then
  aborts the TCP connection (RST): the socket and its buffers are freed at once.

:class:`DrainingServer` is uvicorn's server with a graceful stop: the first ``SIGTERM`` drains the
service (docs/deploy.md) before uvicorn shuts down, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import struct
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..core.runtime import Service
from .settings import ConnectionLimits

__all__ = ["ConnectionLimits", "DrainingServer", "uvicorn_config"]

logger = logging.getLogger("responses_cache.serve")


def _http_protocol() -> type[H11Protocol]:
    """The protocol uvicorn's ``http="auto"`` picks: httptools when installed, else h11."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return H11Protocol
    return HttpToolsProtocol  # type: ignore[return-value]  # same interface as far as used here


def header_timeout_protocol(header_timeout_s: float, base: type[H11Protocol] | None = None) -> type[H11Protocol]:
    """uvicorn's HTTP protocol (``base``; default: httptools when installed, else h11), closing
    connections whose request head does not arrive in time, and answering a WebSocket upgrade
    past the concurrency cap (``limit_concurrency``) with 503 instead of upgrading."""

    class HeaderTimeoutProtocol(base or _http_protocol()):  # type: ignore[misc]
        _header_timer: asyncio.TimerHandle | None = None
        _armed_cycle: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._armed_cycle = self.cycle
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            transport = self.transport
            if transport.is_closing() or transport.get_protocol() is not self:
                return  # closed already, or upgraded to a WebSocket
            if self.cycle is not self._armed_cycle:
                return  # a request head arrived since the timer was set
            transport.close()

        def handle_websocket_upgrade(self, *args: Any) -> None:
            # uvicorn's rule for a request, applied to the upgrade (this connection included).
            limit = self.limit_concurrency
            if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
                self.logger.warning("Exceeded concurrency limit: WebSocket upgrade refused.")
                body = b"Service Unavailable"
                self.transport.write(
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
                )
                self.transport.close()
                return
            super().handle_websocket_upgrade(*args)

    return HeaderTimeoutProtocol


def _unsent_bytes(transport: asyncio.Transport) -> int:
    """Bytes written to ``transport`` that its peer has not acknowledged: the transport's own buffer
    and, where the platform tells (Linux ``TIOCOUTQ``), the kernel's send queue."""
    held = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is None:
        return held
    with contextlib.suppress(ImportError, OSError, ValueError, AttributeError):
        import fcntl  # POSIX only
        import termios

        queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
        held += struct.unpack("i", queued)[0]
    return held


class _AbortiveClose:
    """A transport whose ``close`` gives the peer ``linger_s`` to take what is still unsent, then
    aborts with RST (``SO_LINGER`` 0) instead of leaving the bytes to the kernel.

    An orderly close of a socket with data queued hands that data to the kernel, which keeps the
    socket (FIN-WAIT-1) and keeps offering it to a peer that does not read for minutes; ``abort``
    alone closes the same way. With ``SO_LINGER`` 0 the kernel sends RST and frees both at once."""

    _POLL_S = (0.01, 1.0)  # first and longest wait between checks while the peer takes the rest

    def __init__(self, transport: asyncio.Transport, linger_s: float, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._linger_s = linger_s
        self._loop = loop
        self._closing = False
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._transport.is_closing():
            self._transport.close()
            return
        self._deadline = self._loop.time() + self._linger_s
        self._check(self._POLL_S[0])

    def _check(self, wait: float) -> None:
        self._timer = None
        if self._transport.is_closing():
            return  # lost meanwhile
        left = self._deadline - self._loop.time()
        if _unsent_bytes(self._transport) == 0:
            self._transport.close()  # the peer has everything: an orderly close
        elif left <= 0:
            self.abort()
        else:
            self._timer = self._loop.call_later(min(wait, left), self._check, min(2 * wait, self._POLL_S[1]))

    def abort(self) -> None:
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        sock = self._transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, ValueError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._transport.abort()


def linger_abort_protocol(linger_s: float, base: type[asyncio.Protocol] | None = None) -> type[asyncio.Protocol]:
    """uvicorn's WebSocket protocol (``base``; default: the one uvicorn would pick), aborting the
    TCP connection (RST) when the peer has not taken the last bytes ``linger_s`` after the server
    closed the connection.

    uvicorn only ever *closes* a transport, and an orderly close leaves what is unsent to the
    kernel, so a peer that stops reading keeps its socket (and the bytes queued for it) for as
    long as the kernel lets it. ``WebSocketMode`` aborts such a connection on its side (its state
    is freed at once); this drops the socket too."""
    from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

    chosen = base or AutoWebSocketsProtocol
    if chosen is None:  # no WebSocket library installed: nothing to extend
        raise RuntimeError("uvicorn has no WebSocket implementation available (install websockets)")

    class LingerAbortProtocol(chosen):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # Every close uvicorn makes (the app done, a close handshake, a ping timeout) goes
            # through the wrapper.
            self.transport = _AbortiveClose(transport, linger_s, asyncio.get_running_loop())

        def shutdown(self) -> None:
            # uvicorn's shutdown sends close 1012 on every connection it still holds; on one whose
            # close handshake has begun (the peer's close frame in, the app's answer not yet out)
            # the websockets library refuses (InvalidState) and the exception ends ``serve`` with
            # status 1. Such a connection is closing anyway: let it go.
            try:
                super().shutdown()
            except _invalid_state():
                self.transport.close()

    return LingerAbortProtocol


def _invalid_state() -> type[Exception]:
    try:
        from websockets.exceptions import InvalidState
    except ImportError:  # no websockets library: nothing raises it
        return _NeverRaised
    return InvalidState


class _NeverRaised(Exception):
    pass


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a graceful stop for ``service``.

    The first ``SIGTERM`` (or ``SIGINT``) starts :meth:`Service.drain` while the server keeps
    answering: readiness says 503, new work gets 503, running turns finish within ``deadline_s``,
    WebSocket connections close between turns with 1001. Then uvicorn shuts down as usual (its
    lifespan closes the service: billing flushed) and ``serve`` exits 0 — uvicorn would re-raise
    the signal after its shutdown, ending the process by the signal instead. A second signal cuts
    the drain short (running turns cancelled and billed, the same shutdown); a third forces
    uvicorn's immediate exit (no lifespan shutdown)."""

    def __init__(self, config: uvicorn.Config, service: Service, deadline_s: float) -> None:
        super().__init__(config)
        self.service = service
        self.deadline_s = deadline_s
        #: Signals received so far.
        self.signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        loop = self._loop
        if loop is None or not self.started or self.signals > 2:
            if self.signals > 2:
                self.force_exit = True
            self.should_exit = True
            return
        name = signal.Signals(sig).name
        if self.signals == 1:
            logger.warning("%s: draining (up to %ss; send it again to stop at once)", name, self.deadline_s)
            loop.call_soon_threadsafe(self._start_drain)
        else:
            logger.warning("%s again: stopping now", name)
            loop.call_soon_threadsafe(self._cut)

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain())

    def _cut(self) -> None:
        # The drain stops waiting: what runs is cancelled (and billed) now, the connections close
        # with 1001, and the shutdown follows as soon as they are gone.
        self.service.drainer.expire()
        if self._drain_task is None:
            self.should_exit = True

    async def _drain(self) -> None:
        try:
            await self.service.drain(self.deadline_s)
        except Exception:
            logger.exception("the drain failed; shutting down")
        finally:
            self.should_exit = True


def uvicorn_config(
    app: Any, *, host: str, port: int, limits: ConnectionLimits, protocol: type[H11Protocol] | None = None, **options: Any
) -> uvicorn.Config:
    """A uvicorn config with ``limits`` applied (``protocol``: the HTTP protocol to extend, as in
    :func:`header_timeout_protocol`; ``options``: any other ``uvicorn.Config`` field).

    WebSocket compression (permessage-deflate) is declined unless ``options`` turn it on: uvicorn
    inflates every frame of a socket read before it pauses reading, so one read of compressed
    frames (4 MiB of repeated text deflates to about 4 KiB) would put tens of full-size messages
    in memory at once, past every per-connection bound."""
    options.setdefault("ws_per_message_deflate", False)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=header_timeout_protocol(limits.header_timeout_s, protocol),
        ws=linger_abort_protocol(limits.ws_linger_s),
        timeout_keep_alive=limits.keep_alive_s,
        limit_concurrency=limits.max_connections,
        ws_ping_interval=limits.ws_ping_interval_s,
        ws_ping_timeout=limits.ws_ping_timeout_s,
        **options,
    )
