"""``WebSocketMode``: the thin ASGI edge that gives a Responses app its WebSocket mode.

It intercepts WebSocket upgrades on the configured paths and passes everything else (HTTP,
lifespan, other WebSocket paths) through untouched. Each connection runs three kinds of task:

* the **reader** (this coroutine) feeds frames to the sans-I/O :class:`~.session.Session` and never
  waits on generation;
* one **turn task** per response, started when the session says its lane is free;
* one **writer** draining a bounded outbound queue to the socket.

A disconnect cancels every in-flight turn (the backend sees the cancellation) and frees the
connection's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from starlette.responses import Response as HTTPResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from .budget import CacheBudget
from .metrics import Metrics
from .protocol import events as ev
from .protocol.codec import encode
from .protocol.errors import (
    HTTPErrorBody,
    ResponsesError,
    previous_response_not_found,
    server_error,
)
from .routing import RouteCache
from .runtime import Service
from .session import PendingTurn, Session, SessionConfig
from .state import ResponseState

logger = logging.getLogger("responses_cache.websocket")
_CLOSE = b""  # outbound marker: close the socket (encoded events are never empty)


class WebSocketMode:
    """ASGI middleware: WebSocket mode on ``paths`` of the app it wraps.

    Native mode, in any Starlette/FastAPI app::

        app.add_middleware(WebSocketMode, service=create_service(backend=..., api_keys=[...]))

    turns run through this package's pipeline with the service's backend, and the app's lifespan
    starts and closes the service (its first connection starts it if the server runs no lifespan).

    The bridge, ``app.add_middleware(WebSocketMode)`` (no service): each turn is forwarded
    in-process to the app's own ``POST /v1/responses`` with the whole conversation (see
    :mod:`responses_cache.bridge`); upgrades are authorized by the app itself.
    """

    def __init__(
        self,
        app: ASGIApp,
        service: Service | None = None,
        *,
        paths: Sequence[str] = ("/v1/responses",),
        outbound_queue: int = 1024,
    ) -> None:
        self.app = app
        if service is None:
            from .bridge import bridge_service

            service = bridge_service(app)
        self.service = service
        self.paths = frozenset(p.rstrip("/") for p in paths)
        self.outbound_queue = outbound_queue
        #: The process-wide cap on all connections' caches (``None``: per-connection caps only).
        self.budget = CacheBudget(service.process_cache_bytes) if service.process_cache_bytes else None
        self.connections = 0

    @property
    def config(self) -> SessionConfig:
        return self.service.session

    @property
    def metrics(self) -> Metrics:
        return self.service.metrics

    @property
    def max_message_bytes(self) -> int:
        return self.service.max_message_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "websocket" or self._path(scope) not in self.paths:
            await self.app(scope, receive, send)
            return
        websocket = WebSocket(scope, receive, send)
        tenant = await self.service.authenticator.authenticate(websocket.headers)
        if tenant is None:
            await _deny(websocket, ResponsesError("Incorrect API key provided.", status=401, code="invalid_api_key"))
            return
        try:
            await self.service.start()  # no-op once the lifespan has started it (after the key check)
        except Exception:
            logger.exception("starting the responses-cache service failed")
            await _deny(websocket, server_error())
            return
        await websocket.accept()
        connection = _Connection(self, websocket, tenant, send)
        self.connections += 1
        try:
            await connection.run()
        finally:
            self.connections -= 1

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app's lifespan with the service inside it: started after the app's own
        startup (its resources are ready), closed before the app's shutdown runs."""

        async def receive_around() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.service.aclose()
            return message

        async def send_around(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                try:
                    await self.service.start()
                except Exception as exc:
                    logger.exception("starting the responses-cache service failed")
                    message = {"type": "lifespan.startup.failed", "message": f"responses-cache: {exc!r}"}
            await send(message)

        await self.app(scope, receive_around, send_around)

    @staticmethod
    def _path(scope: Scope) -> str:
        path: str = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        return path.rstrip("/")


async def _deny(websocket: WebSocket, error: ResponsesError) -> None:
    """Refuse the upgrade with an HTTP error response carrying the OpenAI error envelope."""
    body = encode(HTTPErrorBody(error.payload))
    await websocket.send_denial_response(HTTPResponse(body, status_code=error.status, media_type="application/json"))


class _Connection:
    def __init__(self, mode: WebSocketMode, websocket: WebSocket, tenant: str, send: Send) -> None:
        self.mode = mode
        self.ws = websocket
        self._asgi_send = send
        self.service = mode.service.core
        self.session = Session(tenant, mode.config, now=time.monotonic())
        #: The upgrade's credentials, forwarded to backends that call on the client's behalf.
        self.credentials = {k: v for k, v in websocket.headers.items() if k == "authorization"}
        self.routes = RouteCache(self.service.router, tenant)
        self.outbound: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=mode.outbound_queue)
        #: Held while a frame is being written. With nothing queued, a turn writes its event
        #: itself (no hop through the writer task); otherwise the writer keeps the order.
        self._writing = asyncio.Lock()
        self._queued = 0
        self._direct = 0
        self._usable = True
        self.turns: set[asyncio.Task[None]] = set()
        self.closed = False

    async def run(self) -> None:
        writer = asyncio.ensure_future(self._writer())
        lifetime = asyncio.ensure_future(self._lifetime())
        close_code = 1000
        disconnected = False
        try:
            while True:
                message = await self.ws.receive()
                kind = message["type"]
                if kind == "websocket.disconnect":
                    disconnected = True
                    break
                text = message.get("text")
                if text is None:
                    close_code = 1003  # binary frames are not part of the protocol
                    break
                if len(text) > self.mode.max_message_bytes:
                    close_code = 1009
                    break
                self.session.receive(text, time.perf_counter())
                del message, text  # a decoded frame must not outlive its turn (memory per connection)
                await self._pump()
                if self.session.close_code is not None:
                    break
        finally:
            self.closed = True
            lifetime.cancel()
            for task in list(self.turns):
                task.cancel()
            # Wait for the cancelled turns (their backends see the cancellation) before dropping state.
            await asyncio.gather(lifetime, *self.turns, return_exceptions=True)
            self.session.close()
            if self.mode.budget is not None:
                self.mode.budget.forget(self.session)
            if self.session.close_code is not None:
                close_code = self.session.close_code
            if disconnected:
                writer.cancel()  # nobody to flush to
            else:
                await self.outbound.put(None)  # the writer never stops reading before this
            with contextlib.suppress(BaseException):
                await writer
            if not disconnected:
                with contextlib.suppress(Exception):
                    await self.ws.close(close_code)

    async def _lifetime(self) -> None:
        """At the connection's deadline, tell the session (which refuses new work and closes)."""
        deadline = self.session.deadline
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        self.session.tick(max(time.monotonic(), deadline))
        await self._pump()

    async def _pump(self) -> None:
        """Send the session's errors, start what may start, and close when the session says so."""
        for event in self.session.drain():
            await self._send(event)
        if self.closed:
            return
        for pending in self.session.startable():
            task = asyncio.ensure_future(self._turn(pending))
            self.turns.add(task)
            task.add_done_callback(self.turns.discard)
        if self.session.close_code is not None:
            self._queued += 1
            await self.outbound.put(_CLOSE)

    async def _send(self, event: ev.Event) -> None:
        if self.closed or not self._usable:
            await asyncio.sleep(0)  # the peer is gone: let the cancellation reach this turn
            return
        data = encode(event)
        if self._queued == 0 and not self._writing.locked():
            async with self._writing:
                await self._write(data)
            # A write into free socket buffers never suspends: yield now and then, so a fast
            # engine cannot starve the reader (disconnects) or other connections.
            self._direct += 1
            if self._direct % 64 == 0:
                await asyncio.sleep(0)
            return
        self._queued += 1
        await self.outbound.put(data)

    async def _write(self, data: bytes) -> None:
        if not self._usable:
            return
        try:
            await self._asgi_send({"type": "websocket.send", "text": data.decode()})
        except Exception:  # the peer went away: stop generating for it
            self._usable = False
            for task in self.turns:
                task.cancel()

    async def _writer(self) -> None:
        """Drains the outbound queue until ``None``. It keeps draining after the socket broke or was
        closed (discarding), so that producers never block on a queue nobody reads."""
        while True:
            data = await self.outbound.get()
            if data is None:
                return
            async with self._writing:
                if data is _CLOSE:
                    if self._usable:
                        self._usable = False
                        with contextlib.suppress(Exception):
                            await self.ws.close(self.session.close_code or 1000)
                else:
                    await self._write(data)
                self._queued -= 1

    async def _turn(self, pending: PendingTurn) -> None:
        state: ResponseState | None = None
        started = time.perf_counter()
        self.mode.metrics.observe("queue_wait_seconds", started - pending.received_at, {"transport": "websocket"})
        try:
            state = await self._run(pending)
        except ResponsesError as exc:
            self.session.rejected(pending, exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("turn failed")
            self.session.rejected(pending, server_error())
        finally:
            if not self.closed:
                self.mode.metrics.observe("turn_seconds", time.perf_counter() - started, {"transport": "websocket"})
                self.session.finished(pending, state, time.monotonic())
                if self.mode.budget is not None:
                    self.mode.budget.touch(self.session)
                self.session.tick(time.monotonic())
                await self._pump()

    async def _run(self, pending: PendingTurn) -> ResponseState:
        service, session, metrics = self.service, self.session, self.mode.metrics
        labels = {"transport": "websocket"}
        turn = service.prepare(pending.request, session.tenant, "websocket", pending.lane)
        turn.headers = self.credentials
        turn.interrupt = session.activate(pending, turn.response_id, service.supports_steering)
        grace_hits = session.cache.grace_hits
        parent = session.resolve(pending, time.monotonic())
        route = self.routes.get(turn.model)
        wanted = pending.request.previous_response_id
        if wanted is not None:
            metrics.inc("incremental_sends_total", labels)
            if parent is not None:
                metrics.inc("cache_hits_total", labels)
                if session.cache.grace_hits > grace_hits:
                    metrics.inc("cache_grace_hits_total", labels)
            else:
                metrics.inc("cache_misses_total", labels)
                if pending.request.store and service.delegate_misses:
                    turn.delegated_parent = wanted
                elif pending.request.store:
                    # The process-wide hot cache, then the store (and its token-log snapshot).
                    found = await service.resolve(session.tenant, wanted, route)
                    if found is not None:
                        parent = found[0]
                        metrics.inc(f"resolved_{found[1]}_total", labels)
                if parent is None and turn.delegated_parent is None:
                    metrics.inc("previous_response_not_found_total", labels)
                    raise previous_response_not_found(wanted)
        await service.resolve_references(turn, parent, session.items)
        if wanted is None:
            metrics.inc("full_sends_total", labels)
            match = session.match_full_input(pending, turn.items, turn.tools.fingerprint)
            if match is not None:
                parent, reused = match
                turn.items = turn.items[reused:]
                turn.reused_items = reused
                metrics.inc("full_input_reuse_total", labels)
        new_items = turn.items
        state = await service.run(turn, parent, route, self._send)
        if state.response.status != "failed":
            # What this turn added becomes referenceable on the connection (``item_reference``).
            session.items.add(session.tenant, (*new_items, *state.response.output))
        return state
