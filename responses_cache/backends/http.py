"""The HTTP client an engine adapter streams over: httpx's interface on aiohttp's connections.

An engine streams one small server-sent event per output token, and a fast engine's tokens each
arrive alone, so the client's cost per read is paid once per token. httpx's own transport
(httpcore over h11 and anyio, pure Python, a cancel scope and a timer per read) spends about twice
the CPU per streamed chunk of aiohttp's, whose HTTP parser is compiled (``python
benchmarks/engine_read.py``: 94 µs against 45 on a 2-core VM, httpx-sse on top of both).
:func:`engine_client` keeps httpx's interface (the adapters, their tests' ASGI transports and
httpx-sse are written against it) and puts ``httpx-aiohttp``'s transport, from httpx's
maintainers, under it.

httpx's timeouts carry over: ``connect`` bounds opening a connection, ``read`` the wait for each
read, ``pool`` the wait for a free connection. Proxies from the environment (``HTTP_PROXY``…)
go through httpx's own transport, as with any httpx client.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

__all__ = ["engine_client", "engine_transport"]


def engine_transport(limits: httpx.Limits | None = None) -> httpx.AsyncBaseTransport:
    """aiohttp's connection pool as an httpx transport (``limits``: by default httpx's own, 100
    connections, 20 kept alive). Imported here, not with the module: an engine in the same
    process (vLLM's own API server running the middleware) takes an ``httpx.ASGITransport``
    and needs no aiohttp."""
    try:
        from httpx_aiohttp import AiohttpTransport
    except ImportError as exc:  # pragma: no cover - depends on how the adapter was installed
        raise ImportError("an engine adapter's HTTP client needs httpx-aiohttp (pip install httpx-aiohttp)") from exc
    return AiohttpTransport() if limits is None else AiohttpTransport(limits=limits)


def engine_client(
    *,
    timeout: float,
    connect_timeout: float,
    headers: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """The client for an engine's HTTP API: each read waits at most ``timeout`` seconds, a new
    connection ``connect_timeout``. ``transport`` replaces :func:`engine_transport` (an
    ``httpx.ASGITransport`` for an engine in the same process, a test's fake)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout, connect=connect_timeout),
        headers=dict(headers or {}),
        transport=transport or engine_transport(),
    )
