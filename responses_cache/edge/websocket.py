"""``WebSocketMode``: the thin ASGI edge that gives a Responses app its WebSocket mode.

It intercepts WebSocket upgrades on the configured paths and passes everything else (HTTP,
lifespan, other WebSocket paths) through untouched. Each connection runs three kinds of task:

* the **reader** (this coroutine) feeds frames to the sans-I/O :class:`~.session.Session` and never
  waits on generation;
* one **turn task** per response, started when the session says its lane is free;
* one **writer** draining a bounded outbound queue to the socket.

A disconnect cancels every in-flight turn (the backend sees the cancellation) and frees the
connection's state. So does a peer that stops reading: every write has a timeout
(``write_timeout_s``), after which the connection is aborted, and the lifetime is enforced even
while writes are blocked (``SessionConfig.lifetime_grace_s`` after the deadline, the connection is
aborted whatever it is doing). Request frames held by unfinished turns are charged to a
per-connection and a process-wide byte budget (:class:`~.session.InputBudget`).

A client cannot make the event loop take its frames faster than its input rate
(:mod:`~.input_rate`): each frame is charged to the connection's and its tenant's budget before it
is decoded, and while either is in debt the reader neither decodes it nor asks the server for the
next frame. uvicorn stops reading a WebSocket's socket while a message it has received waits for
the app (its ``websockets-sansio`` implementation, the one ``ws="auto"`` picks), so the rest of
the client's frames wait in the client's own socket buffers: a flooding client slows itself, not
the loop. Events waiting for a peer are bounded in bytes too (``outbound_bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from enum import Enum
from typing import Any, Literal

from starlette.responses import Response as HTTPResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from ..backends.routing import RouteCache
from ..core.responder import EdgeContext
from ..core.runtime import Service
from ..limits.memory import RELEASE_AFTER_BYTES, release_free_memory
from ..limits.quotas import Admission, QuotaExceeded
from ..observability.metrics import Metrics
from ..observability.tracing import trace_headers
from ..protocol import events as ev
from ..protocol.codec import encode
from ..protocol.errors import (
    HTTPErrorBody,
    ResponsesError,
    server_error,
    shutting_down,
)
from ..protocol.ids import new_id
from ..session.budget import CacheBudget
from ..session.session import (
    InputBudget,
    PendingTurn,
    Session,
    SessionConfig,
    frame_cost,
    held_frame,
)
from ..storage.state import ResponseState
from ..storage.store import holds_items
from .host import HostScope

logger = logging.getLogger("responses_cache.websocket")
_LARGE_FRAME = 64 * 1024
#: After a large connection ends, how long before free memory is returned to the system.
_RELEASE_DELAY_S = 0.1
_CLOSE = b""  # outbound marker: close the socket (encoded events are never empty)
#: A turn writing frames straight to the socket yields to the event loop after this many: its
#: writes (into free socket buffers) and its engine's reads (output already buffered) complete
#: without suspending, and the connection's reader takes the client's next frame (a steer, a
#: close) only when the turn yields.
YIELD_EVERY = 64


class WebSocketMode:
    """ASGI middleware: WebSocket mode on ``paths`` of the app it wraps.

    Native mode, in any Starlette/FastAPI app::

        app.add_middleware(WebSocketMode, service=create_service(backend=..., api_keys=[...]))

    turns run through this package's pipeline with the service's backend, and the app's lifespan
    starts and closes the service (its first connection starts it if the server runs no lifespan).

    The bridge, ``app.add_middleware(WebSocketMode)`` (no service): each turn is forwarded
    in-process to the app's own ``POST /v1/responses`` with the whole conversation (see
    :mod:`responses_cache.edge.bridge`); upgrades are authorized by the app itself.

    Who may connect is the service's authenticator (a service always has one); the bridge admits
    an upgrade only when the app answers 2xx.
    """

    def __init__(
        self,
        app: ASGIApp,
        service: Service | None = None,
        *,
        paths: Sequence[str] = ("/v1/responses",),
        outbound_queue: int = 1024,
        outbound_bytes: int | None = None,
        resolves_previous_response_ids: bool | None = None,
    ) -> None:
        self.app = app
        #: The bridge's view of the host's scope (``None`` in native mode).
        self._host: HostScope | None = None
        if service is None:
            from .bridge import bridge_service  # the bridge's extra is imported only in bridge mode

            self._host = HostScope()
            service = bridge_service(app, resolves_previous_response_ids=resolves_previous_response_ids, host=self._host)
        self.service = service
        self.paths = frozenset(p.rstrip("/") for p in paths)
        self.outbound_queue = outbound_queue
        #: Bytes of encoded events queued per connection (one event is always let in, whatever
        #: its size): beyond it, whoever produces the next event waits for the peer to read.
        self.outbound_bytes = outbound_bytes if outbound_bytes is not None else service.outbound_bytes
        #: The process-wide cap on all connections' caches (``None``: per-connection caps only).
        self.budget = CacheBudget(service.process_cache_bytes, service.metrics) if service.process_cache_bytes else None
        #: A write (an event, the close frame) that takes longer aborts the connection.
        self.write_timeout_s = service.write_timeout_s
        #: Connections aborted because a write timed out or the lifetime grace ran out.
        self.aborted = 0
        self.connections = 0
        #: The most bytes of events ever queued for one connection.
        self.outbound_peak = 0

    @property
    def config(self) -> SessionConfig:
        return self.service.session

    @property
    def metrics(self) -> Metrics:
        return self.service.metrics

    @property
    def max_message_bytes(self) -> int:
        return self.service.max_message_bytes

    @property
    def input_budget(self) -> InputBudget | None:
        """The process-wide cap on request frames held by unfinished turns (shared with HTTP)."""
        return self.service.input_budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "websocket" or self._path(scope) not in self.paths:
            await self.app(scope, receive, send)
            return
        if self._host is not None:
            self._host.observe(scope)  # before the app is asked anything (authorization included)
        websocket = WebSocket(scope, receive, send)
        try:
            tenant = await self.service.authenticator.authenticate(websocket.headers)
        except Exception:  # fail closed: an authenticator that cannot answer admits no one
            logger.exception("the authenticator failed; the upgrade is refused")
            tenant = None
        if tenant is None:
            await _deny(websocket, ResponsesError("Incorrect API key provided.", status=401, code="invalid_api_key"))
            return
        if self.service.draining:  # the process is going away: the client reconnects elsewhere
            await _deny(websocket, shutting_down())
            return
        try:
            await self.service.start()  # no-op once the lifespan has started it (after the key check)
        except Exception:
            logger.exception("starting the responses-cache service failed")
            await _deny(websocket, server_error())
            return
        quotas = self.service.core.quotas
        lease = new_id("conn")
        if quotas is not None:
            try:
                await quotas.connect(tenant, lease)  # the tenant's open-connections quota
            except ResponsesError as exc:
                await _deny(websocket, exc)
                return
        try:
            await websocket.accept()
            connection = _Connection(self, websocket, tenant, send)
            self.connections += 1
            unwatch = self.service.drainer.watch(connection)  # a drain waits for it to close
            try:
                await connection.run()
            finally:
                unwatch()
                self.connections -= 1
                if connection.taken_bytes >= RELEASE_AFTER_BYTES:
                    # What its large frames made the allocator keep goes back to the system.
                    _release_soon()
        finally:
            if quotas is not None:
                quotas.disconnect(tenant, lease)

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
    await websocket.send_denial_response(
        HTTPResponse(body, status_code=error.status, media_type="application/json", headers=error.headers)
    )


class ConnectionState(Enum):
    """Where a WebSocket connection is in its life, as its tasks see it (the session's own view,
    :class:`~.session.SessionState`, is about work; this one is about the socket)::

        OPEN ──(our close frame goes out)──▶ CLOSING ──┐
          │ ───(a write fails)─────────────▶ BROKEN ───┼──(stop)──▶ CLOSED
          │ ───(abort: a stuck peer)───────▶ ABORTED ──┘              ▲
          └────(stop)──▶ FLUSHING ──(close frame out / write fails)───┘

    CLOSING and BROKEN can still be aborted; "stop" is the reader ending (the peer left, or a
    close was decided) and the connection tearing down. Only OPEN takes new events; OPEN and
    FLUSHING still write what is queued.
    """

    #: Reading frames, running turns, writing their events.
    OPEN = "open"
    #: The session closed the connection and our close frame went out: nothing more is written.
    CLOSING = "closing"
    #: A write failed (the peer went away): nothing more is written, the turns are cancelled.
    BROKEN = "broken"
    #: A stuck peer (a write timed out, or the lifetime's grace ran out): turns, reader and writer
    #: cancelled, what was queued discarded; the peer is treated as gone.
    ABORTED = "aborted"
    #: Tearing down with the socket still writable: no new turns or events, but what is queued
    #: still goes out, then the close frame.
    FLUSHING = "flushing"
    #: Tearing down, and nothing more is written.
    CLOSED = "closed"


_Transition = Literal["close_sent", "write_failed", "abort", "stop"]

#: What each transition does from each state (a state absent from a row: the transition leaves
#: it as it is). Every change of :attr:`ConnectionLifecycle.state` goes through this table.
_TRANSITIONS: dict[_Transition, dict[ConnectionState, ConnectionState]] = {
    "close_sent": {ConnectionState.OPEN: ConnectionState.CLOSING, ConnectionState.FLUSHING: ConnectionState.CLOSED},
    "write_failed": {ConnectionState.OPEN: ConnectionState.BROKEN, ConnectionState.FLUSHING: ConnectionState.CLOSED},
    "abort": {
        ConnectionState.OPEN: ConnectionState.ABORTED,
        ConnectionState.CLOSING: ConnectionState.ABORTED,
        ConnectionState.BROKEN: ConnectionState.ABORTED,
        ConnectionState.FLUSHING: ConnectionState.CLOSED,
    },
    "stop": {
        ConnectionState.OPEN: ConnectionState.FLUSHING,
        ConnectionState.CLOSING: ConnectionState.CLOSED,
        ConnectionState.BROKEN: ConnectionState.CLOSED,
        ConnectionState.ABORTED: ConnectionState.CLOSED,
    },
}


#: The states in which what is queued may still be written (:attr:`ConnectionLifecycle.writable`).
_WRITABLE = frozenset({ConnectionState.OPEN, ConnectionState.FLUSHING})


class ConnectionLifecycle:
    """A connection's :class:`ConnectionState` and its transitions, sans I/O: the connection's
    tasks ask it what they may do, and tell it what happened."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = ConnectionState.OPEN

    @property
    def accepting(self) -> bool:
        """New events are sent (others are dropped: the peer is gone or the connection ends)."""
        return self.state is ConnectionState.OPEN

    @property
    def writable(self) -> bool:
        """What is queued may still be written to the socket."""
        return self.state in _WRITABLE

    @property
    def stopped(self) -> bool:
        """The connection is tearing down: no turn starts, and finished turns leave the session alone."""
        return self.state in (ConnectionState.FLUSHING, ConnectionState.CLOSED)

    def close_sent(self) -> None:
        """Our close frame is about to go out (only while :attr:`writable`)."""
        self._apply("close_sent")

    def write_failed(self) -> None:
        """A write raised: the peer went away."""
        self._apply("write_failed")

    def abort(self) -> bool:
        """A stuck peer; ``False`` when the connection was aborted already or has closed (nothing to do)."""
        return self._apply("abort")

    def stop(self) -> bool:
        """The reader ended and the connection tears down; ``True`` when it had been aborted."""
        aborted = self.state is ConnectionState.ABORTED
        self._apply("stop")
        return aborted

    def _apply(self, transition: _Transition) -> bool:
        following = _TRANSITIONS[transition].get(self.state)
        if following is None:
            return False
        self.state = following
        return True


class _Connection:
    def __init__(self, mode: WebSocketMode, websocket: WebSocket, tenant: str, send: Send) -> None:
        self.mode = mode
        self.ws = websocket
        self._asgi_send = send
        self.responder = mode.service.core
        self.session = Session(
            tenant, mode.config, now=time.monotonic(), input_budget=mode.input_budget,
            pack_stored=not holds_items(self.responder.store),
        )
        rate = mode.service.input_rate
        #: This connection's input rate budget (``None``: unlimited).
        self.input = rate.open(tenant) if rate is not None else None
        #: The upgrade's credentials, forwarded to backends that call on the client's behalf.
        self.credentials = {k: v for k, v in websocket.headers.items() if k == "authorization"}
        #: The upgrade's W3C trace context: every turn on the connection continues that trace.
        self.trace = trace_headers(websocket.headers)
        self.routes = RouteCache(self.responder.router, tenant)
        self.outbound: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=mode.outbound_queue)
        #: Held while a frame is being written. With nothing queued, a turn writes its event
        #: itself (no hop through the writer task); otherwise the writer keeps the order.
        self._writing = asyncio.Lock()
        self._queued = 0
        #: Bytes of the events in ``outbound``, and set whenever some of them have been taken.
        self._queued_bytes = 0
        self._drained = asyncio.Event()
        self._direct = 0
        #: Every decision about what the connection may still do reads this.
        self.lifecycle = ConnectionLifecycle()
        self.turns: set[asyncio.Task[None]] = set()
        #: Turns already told to stop: each is cancelled once (see :meth:`_cancel_turns`).
        self._cancelled: set[asyncio.Task[None]] = set()
        self._reader: asyncio.Task[tuple[int, bool]] | None = None
        self._writer_task: asyncio.Task[None] | None = None
        #: When the write in progress started (``None``: no write in progress).
        self._write_started: float | None = None
        #: Bytes of the frames read from the peer so far.
        self.taken_bytes = 0

    async def run(self) -> None:
        writer = self._writer_task = asyncio.ensure_future(self._writer())
        lifetime = asyncio.ensure_future(self._lifetime())
        watchdog = asyncio.ensure_future(self._watchdog())
        reader = self._reader = asyncio.ensure_future(self._read())
        close_code, disconnected = 1000, False
        try:
            close_code, disconnected = await reader
        except asyncio.CancelledError:
            # Cancelled from outside (server shutdown), not by an abort: still clean up.
            if self.lifecycle.state is not ConnectionState.ABORTED:
                reader.cancel()
                raise
            disconnected = True  # aborted: the peer is treated as gone, nothing more is written
        finally:
            aborted = self.lifecycle.stop()
            if self.input is not None:
                self.input.close()
            lifetime.cancel()
            watchdog.cancel()
            self._cancel_turns()
            try:
                # Wait for the cancelled turns (their backends see the cancellation) before
                # dropping state. Cancelled meanwhile (server shutdown): the state is still freed.
                await _settle([lifetime, watchdog, *self.turns])
            except BaseException:
                writer.cancel()
                raise
            finally:
                self.session.close()
                if self.mode.budget is not None:
                    self.mode.budget.forget(self.session)
                if aborted or disconnected:
                    writer.cancel()  # nobody to flush to
                    self._discard_outbound()
            if self.session.close_code is not None:
                close_code = self.session.close_code
            if not (disconnected or aborted):
                await self.outbound.put(None)  # the writer never stops reading before this
            await _settle([writer])
            if not disconnected and self.lifecycle.writable:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.ws.close(close_code), self.mode.write_timeout_s)

    async def _read(self) -> tuple[int, bool]:
        """Feed frames to the session until the peer leaves or the session closes:
        ``(close code, whether the peer disconnected)``."""
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return 1000, True
            text = message.get("text")
            if text is None:
                return 1003, False  # binary frames are not part of the protocol
            frame = held_frame(text)  # a non-ASCII text as its UTF-8: never wider than sent
            size = len(frame)
            self.taken_bytes += size
            if size > self.mode.max_message_bytes:
                return 1009, False
            cost = frame_cost(text, size)
            del message, text  # a decoded frame must not outlive its turn (memory per connection)
            if self.input is not None:
                # Over budget: neither decode this frame nor ask for the next until it is paid for.
                await self.input.admit(size)
            large = size >= _LARGE_FRAME
            self.session.receive(frame, time.perf_counter(), size, cost)
            del frame
            await self._pump()
            if large:
                # Decoding a large frame took a while: let other connections run before the next
                # (frames already buffered are otherwise read back to back without yielding).
                await asyncio.sleep(0)
            if self.session.close_code is not None:
                return 1000, False

    def drain_started(self) -> None:
        """The service drains: refuse new turns, let the running ones end, then close with 1001
        (:meth:`~responses_cache.session.session.Session.shutdown`), never mid-answer."""
        self.session.shutdown()
        task = asyncio.ensure_future(self._pump())  # an idle connection closes now
        self.turns.add(task)
        task.add_done_callback(self._forget)

    def drain_expired(self) -> None:
        """The drain's deadline passed: cancel the running turns (billed, the engine told to
        stop, as on a disconnect); the connection then closes with 1001."""
        self._cancel_turns()

    def _abort(self) -> None:
        """A stuck peer: stop writing, cancel every turn and the reader; :meth:`run` frees the state."""
        if not self.lifecycle.abort():
            return
        self.mode.aborted += 1
        self._cancel_turns()
        if self._reader is not None:
            self._reader.cancel()
        if self._writer_task is not None:
            self._writer_task.cancel()
        self._discard_outbound()  # wakes anything waiting to queue an event

    def _cancel_turns(self) -> None:
        """Cancel every turn, each once. A peer that leaves is seen twice (a write fails, then the
        reader gets the disconnect), and the first cancellation starts the turn's unwinding: the
        backend's stream being closed, which is what stops the engine. A second one would land in
        that close and could cut it short."""
        for task in self.turns - self._cancelled:
            self._cancelled.add(task)
            task.cancel()

    def _discard_outbound(self) -> None:
        while not self.outbound.empty():
            data = self.outbound.get_nowait()
            if data:
                self._queued_bytes -= len(data)
        self._drained.set()

    async def _lifetime(self) -> None:
        """At the connection's deadline, tell the session (which refuses new work and closes once
        idle); if the connection is still there after the grace period, abort it."""
        deadline = self.session.deadline
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        self.session.tick(max(time.monotonic(), deadline))
        grace = asyncio.ensure_future(asyncio.sleep(self.mode.config.lifetime_grace_s))
        try:
            await self._pump()  # may wait on a blocked write (bounded by the write timeout)
            await grace
        finally:
            grace.cancel()
        self._abort()

    async def _pump(self) -> None:
        """Send the session's errors, start what may start, and close when the session says so."""
        for event in self.session.drain():
            await self._send(event)
        if self.lifecycle.stopped:
            return
        for pending in self.session.startable():
            task = asyncio.ensure_future(self._turn(pending))
            self.turns.add(task)
            task.add_done_callback(self._forget)
        if self.session.close_code is not None:
            self._queued += 1
            await self.outbound.put(_CLOSE)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self.turns.discard(task)
        self._cancelled.discard(task)

    async def _send(self, event: ev.Event) -> None:
        if self.lifecycle.state is not ConnectionState.OPEN:  # not accepting (per event: no property call)
            await asyncio.sleep(0)  # the peer is gone: let the cancellation reach this turn
            return
        data = encode(event)
        if self._queued == 0 and not self._writing.locked():
            async with self._writing:
                await self._write(data)
            # A write into free socket buffers never suspends: yield now and then, so a fast
            # engine cannot starve the reader (steers, disconnects) or other connections.
            self._direct += 1
            if self._direct % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            return
        self._queued += 1
        # Bounded in bytes as well as in events: a peer that does not read holds at most
        # ``outbound_bytes`` (or one event) here, and the turns producing more wait.
        while self._queued_bytes > 0 and self._queued_bytes + len(data) > self.mode.outbound_bytes and self.lifecycle.writable:
            self._drained.clear()
            await self._drained.wait()
        self._queued_bytes += len(data)
        self.mode.outbound_peak = max(self.mode.outbound_peak, self._queued_bytes)
        await self.outbound.put(data)

    async def _write(self, data: bytes) -> None:
        if self.lifecycle.state not in _WRITABLE:  # per event: no property call
            return
        self._write_started = time.monotonic()  # the watchdog aborts a write that never returns
        try:
            await self._asgi_send({"type": "websocket.send", "text": data.decode()})
        except Exception:  # the peer went away: stop generating for it
            self.lifecycle.write_failed()
            self._cancel_turns()
        finally:
            self._write_started = None

    async def _watchdog(self) -> None:
        """Abort the connection when one write (an event, the close frame) has been waiting on the
        peer for longer than ``write_timeout_s``: one timer per connection, nothing per write."""
        timeout = self.mode.write_timeout_s
        while True:
            await asyncio.sleep(timeout / 4)
            started = self._write_started
            if started is not None and time.monotonic() - started > timeout:
                logger.info("a write waited on the peer for over %ss: aborting the connection", timeout)
                self._abort()
                return

    async def _writer(self) -> None:
        """Drains the outbound queue until ``None``. It keeps draining after the socket broke or was
        closed (discarding), so that producers never block on a queue nobody reads."""
        while True:
            data = await self.outbound.get()
            if data is None:
                return
            async with self._writing:
                if data is _CLOSE:
                    if self.lifecycle.writable:
                        self.lifecycle.close_sent()
                        self._write_started = time.monotonic()
                        try:
                            await self.ws.close(self.session.close_code or 1000)
                        except Exception:
                            pass
                        finally:
                            self._write_started = None
                else:
                    await self._write(data)
                    self._queued_bytes -= len(data)
                    self._drained.set()
                self._queued -= 1

    async def _turn(self, pending: PendingTurn) -> None:
        state: ResponseState | None = None
        started = time.perf_counter()
        self.mode.metrics.observe("queue_wait_seconds", started - pending.received_at, {"transport": "websocket"})
        try:
            state = await self._run(pending)
        except ResponsesError as exc:
            pending.never_ran = isinstance(exc, QuotaExceeded)
            self.session.rejected(pending, exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("turn failed")
            self.session.rejected(pending, server_error())
        finally:
            if not self.lifecycle.stopped:
                self.mode.metrics.observe("turn_seconds", time.perf_counter() - started, {"transport": "websocket"})
                self.session.finished(pending, state, time.monotonic())
                if self.mode.budget is not None:
                    self.mode.budget.touch(self.session)
                self.session.tick(time.monotonic())
                await self._pump()

    async def _run(self, pending: PendingTurn) -> ResponseState:
        responder, session = self.responder, self.session
        admission = await responder.admit(session.tenant)  # 429 rate_limit_exceeded: an error event
        try:
            return await self._run_admitted(pending, admission)
        finally:
            admission.release()  # a turn that ran has released it already, with its usage

    async def _run_admitted(self, pending: PendingTurn, admission: Admission) -> ResponseState:
        responder, session = self.responder, self.session
        edge = EdgeContext(admission, self.credentials, self.trace)
        turn = responder.prepare(pending.request, session.tenant, "websocket", pending.lane, edge=edge)
        pending.request = turn.request  # decoded: the frame goes (its cost now covers the input)
        turn = turn.on_connection(
            session.activate(pending, turn.response_id, responder.supports_steering), session.appendable(pending)
        )
        if pending.size >= _LARGE_FRAME:
            await asyncio.sleep(0)  # decoding took a while: let other connections run in between
        route = self.routes.get(turn.model)
        lineage = await responder.parent_of(turn, route, session.turn_cache(pending, time.monotonic()))
        state = await responder.run(turn, lineage, route, self._send)
        if state.response.status != "failed":
            # What this turn added becomes referenceable on the connection (``item_reference``).
            session.items.add(session.tenant, (*lineage.items, *state.response.output))
        return state


def _release_soon() -> None:
    """Return the allocator's free memory to the system on a worker thread, a moment from now:
    once the server has dropped the connection's last frames too (see :mod:`~responses_cache.limits.memory`)."""
    loop = asyncio.get_running_loop()
    loop.call_later(_RELEASE_DELAY_S, lambda: loop.run_in_executor(None, release_free_memory))


async def _settle(tasks: list[asyncio.Task[Any]]) -> None:
    """Wait until ``tasks`` are done and consume their outcomes.

    Unlike ``asyncio.gather``, a cancellation of the *caller* is not routed through the tasks:
    it reaches the caller as its own (so a cancel scope around the application, as in anyio,
    recognises it), and the tasks are left to finish their cleanup."""
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()
