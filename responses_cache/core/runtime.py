"""``Service``: one configured responses-cache, ready to mount, with one lifecycle.

:func:`~responses_cache.create_service` builds it; :class:`~responses_cache.WebSocketMode` mounts
it into any ASGI app (``app.add_middleware(WebSocketMode, service=service)``) and runs
:meth:`Service.start` and :meth:`Service.aclose` inside that app's lifespan;
:func:`~responses_cache.create_app` serves it over HTTP too. Outside an ASGI server (scripts,
tests) use ``async with service: ...``.

A graceful stop is :meth:`Service.drain` then :meth:`Service.aclose`: ``serve`` does both on
``SIGTERM``; a host app mounting the middleware awaits ``service.drain(deadline_s)`` before its
server shuts down (docs/deploy.md). :meth:`Service.ready` is what a readiness probe asks.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from types import TracebackType

from ..backends.routing import DEFAULT_CONTEXT_WINDOW
from ..limits.input_rate import InputRate
from ..observability.metrics import Metrics
from ..session.session import InputBudget, SessionConfig
from .auth import Authenticator
from .background import BackgroundRunner
from .lifecycle import Drain, Resources
from .responder import Responder

#: Defaults shared by every entry point (``ServerConfig``, ``serve`` settings, the bridge).
__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "DEFAULT_DRAIN_TIMEOUT_S",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_OUTBOUND_BYTES",
    "DEFAULT_PROCESS_CACHE_BYTES",
    "DEFAULT_PROCESS_INPUT_BYTES",
    "DEFAULT_WRITE_TIMEOUT_S",
    "Service",
]

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DEFAULT_PROCESS_CACHE_BYTES = 4 * 1024**3
DEFAULT_PROCESS_INPUT_BYTES = 1024**3
DEFAULT_WRITE_TIMEOUT_S = 30.0
DEFAULT_OUTBOUND_BYTES = 1024 * 1024
#: How long a drain lets running turns finish before it cuts them.
DEFAULT_DRAIN_TIMEOUT_S = 30.0
#: How long readiness waits for the store's ping.
_PING_TIMEOUT_S = 2.0

logger = logging.getLogger("responses_cache.lifecycle")


@dataclass(eq=False)
class Service:
    """What every mount of one responses-cache shares: the pipeline, routing and store
    (:attr:`core`), who may connect, the session and cache policy, metrics, and the plugins to
    start and close."""

    core: Responder
    authenticator: Authenticator
    session: SessionConfig
    metrics: Metrics
    #: Largest request body / WebSocket message accepted, in bytes.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: The process-wide cap on all WebSocket connections' caches (``None``: per-connection only).
    process_cache_bytes: int | None = DEFAULT_PROCESS_CACHE_BYTES
    #: The process-wide cap on request bytes held by unfinished turns, shared by the WebSocket
    #: and HTTP edges (``None``: per-connection caps only).
    input_budget: InputBudget | None = field(default_factory=lambda: InputBudget(DEFAULT_PROCESS_INPUT_BYTES))
    #: A WebSocket write that waits on the peer longer aborts the connection.
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    #: Bytes of events queued for one WebSocket peer (one event always fits); beyond it the turns
    #: producing more wait for the peer to read.
    outbound_bytes: int = DEFAULT_OUTBOUND_BYTES
    #: Input bytes per second per WebSocket connection and per tenant (``None``: unlimited).
    input_rate: InputRate | None = field(default_factory=InputRate)
    resources: Resources = field(default_factory=lambda: Resources(()))
    #: Runs ``background: true`` responses (HTTP only; ``None``: background mode is refused).
    background: BackgroundRunner | None = None
    #: The graceful stop: what is admitted, and the work a drain waits for.
    drainer: Drain = field(default_factory=Drain)

    @property
    def draining(self) -> bool:
        """A drain has begun: new connections, turns and background responses are refused."""
        return self.drainer.draining

    async def ready(self) -> bool:
        """Whether to send this process traffic: started (engines handshaken, stores and billing
        open), not draining, and the store answering its ping (where it has one)."""
        if self.drainer.draining or not self.resources.started:
            return False
        ping = getattr(self.core.store, "ping", None)
        if ping is None:
            return True
        try:
            await asyncio.wait_for(ping(), _PING_TIMEOUT_S)
        except Exception as exc:
            logger.warning("not ready: the store did not answer its ping (%r)", exc)
            return False
        return True

    async def drain(self, deadline_s: float = DEFAULT_DRAIN_TIMEOUT_S) -> bool:
        """Stop gracefully, before :meth:`aclose`: readiness goes unready and nothing new is
        admitted; running turns and background responses finish, WebSocket connections close
        between turns (1001); at ``deadline_s`` what still runs is cancelled and billed as on a
        disconnect. ``True`` when everything finished in time. Cancelled (a second signal), it
        cuts everything at once and re-raises."""
        finished = await self.drainer.run(deadline_s)
        if not finished:  # the cut turns unwind (their usage is billed) and their sockets close
            await self.drainer.settled(self.write_timeout_s)
        return finished

    async def start(self) -> None:
        """Start the owned plugins (billing worker, backend clients, stores). Idempotent: the
        lifespan calls it, and the first connection does if no lifespan ran."""
        await self.resources.start()

    async def aclose(self) -> None:
        """Drain billing and close the owned plugins, in reverse order of starting."""
        await self.resources.aclose()

    async def __aenter__(self) -> Service:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
