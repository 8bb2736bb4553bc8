"""Running an app under uvicorn with every connection limit set (see ``docs/limits.md``).

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and answers 503 past a
concurrency cap (``limit_concurrency``), but it gives a connection that never completes a
request's headers (a bare TCP connect, a request line sent byte by byte) all the time it wants.
:func:`header_timeout_protocol` adds that timeout to uvicorn's HTTP protocol (httptools or h11,
as uvicorn would choose): a connection that has
not completed a request's headers within ``header_timeout_s`` of connecting (or of its previous
response) is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .settings import ConnectionLimits

__all__ = ["ConnectionLimits", "uvicorn_config"]


def _http_protocol() -> type[H11Protocol]:
    """The protocol uvicorn's ``http="auto"`` picks: httptools when installed, else h11."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return H11Protocol
    return HttpToolsProtocol  # type: ignore[return-value]  # same interface as far as used here


def header_timeout_protocol(header_timeout_s: float, base: type[H11Protocol] | None = None) -> type[H11Protocol]:
    """uvicorn's HTTP protocol (``base``; default: httptools when installed, else h11), closing
    connections whose request head does not arrive in time."""

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

    return HeaderTimeoutProtocol


def linger_abort_protocol(linger_s: float, base: type[asyncio.Protocol] | None = None) -> type[asyncio.Protocol]:
    """uvicorn's WebSocket protocol (``base``; default: the one uvicorn would pick), aborting the
    TCP connection when the peer has not taken the last bytes ``linger_s`` after the app is done.

    uvicorn only ever *closes* a transport, and a closing transport waits for its write buffer to
    drain, so a peer that stops reading keeps its socket established (and its buffer held) for as
    long as the kernel lets it. ``WebSocketMode`` aborts such a connection on its side (its state
    is freed at once); this drops the socket too."""
    from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

    chosen = base or AutoWebSocketsProtocol
    if chosen is None:  # no WebSocket library installed: nothing to extend
        raise RuntimeError("uvicorn has no WebSocket implementation available (install websockets)")

    class LingerAbortProtocol(chosen):  # type: ignore[valid-type,misc]
        async def run_asgi(self) -> None:
            try:
                await super().run_asgi()
            finally:
                transport = self.transport
                if transport is not None:
                    # Aborting a transport that has closed by then is a no-op.
                    self.loop.call_later(linger_s, transport.abort)

    return LingerAbortProtocol


def uvicorn_config(
    app: Any, *, host: str, port: int, limits: ConnectionLimits, protocol: type[H11Protocol] | None = None, **options: Any
) -> uvicorn.Config:
    """A uvicorn config with ``limits`` applied (``protocol``: the HTTP protocol to extend, as in
    :func:`header_timeout_protocol`; ``options``: any other ``uvicorn.Config`` field)."""
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
