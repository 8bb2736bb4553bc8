"""Background responses (``background: true`` with ``store: true``): a response that runs without
the client's connection.

:class:`BackgroundRunner` starts the turn as a task of this process and answers for it:

* **status** — the response is in the store from the start: ``queued`` before the task runs,
  ``in_progress`` from ``response.created``, then its final state (the pipeline stores a
  ``completed`` or ``incomplete`` one; the runner a ``failed`` or ``cancelled`` one, with the
  output produced until then). ``GET /v1/responses/{id}`` reads the store, so with a shared
  store (Redis) every process answers it.
* **events** — every event is kept in order (``sequence_number`` is its index), so a client
  can (re)attach to the stream from any point (``starting_after``) while the response runs and
  for a while after: the last ``retain`` finished responses keep theirs. With a store that
  relays events (:class:`EventRelay`: Redis), they are also written there in batches, and any
  process can stream them.
* **cancel** — a running response's task is cancelled: the engine request is aborted (its
  stream closed) and the usage so far billed ``cancelled``. With a store that relays cancels
  (Redis), a process that does not run the response tells the one that does.
* **restart** — a process that dies leaves its background responses ``in_progress``; on the
  next start the runner marks each one ``failed`` (``server_error``), found from the billing
  journal's open entries (a journal is needed for that).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgspec
from cachetools import LRUCache

from ..backends.routing import Route
from ..pipeline.turn import Lineage, Turn
from ..protocol import events as ev
from ..protocol.codec import encode
from ..protocol.errors import ResponsesError, invalid_request
from ..protocol.items import HostedItem, WireItem
from ..protocol.response import Response, ResponseErrorInfo
from ..storage.store import StoredResponse
from .lifecycle import Drain
from .responder import Responder

logger = logging.getLogger("responses_cache.background")

ACTIVE = ("queued", "in_progress")
#: How long a cancel waits for the response to end (here or in the process running it).
CANCEL_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class Frame:
    """One event of a background response: its ``type`` and its JSON."""

    type: bytes
    data: bytes


@runtime_checkable
class EventRelay(Protocol):
    """A shared store that carries background events and cancels between processes."""

    async def append_events(self, tenant: str, response_id: str, first: int, frames: Sequence[tuple[bytes, bytes]]) -> None:
        """Append ``frames`` (``(type, json)``; the first is event number ``first``)."""
        ...

    async def read_events(
        self, tenant: str, response_id: str, after: int, wait_s: float
    ) -> list[tuple[int, bytes, bytes]]:
        """Events numbered above ``after`` (waiting up to ``wait_s`` for one): ``(number, type, json)``."""
        ...

    async def publish_cancel(self, tenant: str, response_id: str) -> int:
        """Ask the process running the response to cancel it; how many processes heard."""
        ...

    async def listen_cancels(self, on_cancel: Callable[[str, str], None]) -> Callable[[], Any]:
        """Call ``on_cancel(tenant, response_id)`` for each cancel published; returns the
        coroutine function that stops listening."""
        ...


@dataclass(eq=False)
class _Run:
    tenant: str
    stored: StoredResponse
    frames: list[Frame] = field(default_factory=list)
    output: list[WireItem] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    done: bool = False
    #: Frames not yet written to the relay, and the number of the first of them.
    unrelayed: list[Frame] = field(default_factory=list)
    relayed: int = 0
    relaying: bool = False

    def add(self, frame: Frame) -> None:
        self.frames.append(frame)
        self.unrelayed.append(frame)
        self.wake()

    def wake(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


class BackgroundRunner:
    """Runs ``background: true`` responses of one process (see the module docstring)."""

    def __init__(self, responder: Responder, *, retain: int = 1024, clock: Callable[[], float] = time.time) -> None:
        self.responder = responder
        self.clock = clock
        self._running: dict[tuple[str, str], _Run] = {}
        #: Finished responses whose events are kept for late readers.
        self._finished: LRUCache[tuple[str, str], _Run] = LRUCache(maxsize=max(1, retain))
        self._stop_listening: Callable[[], Any] | None = None
        self._relay_tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        #: Background responses marked ``failed`` at start-up (their process died).
        self.recovered = 0
        #: The service's drain, which waits for the running responses (set by the service).
        self.drain: Drain | None = None

    @property
    def relay(self) -> EventRelay | None:
        store = self.responder.store
        return store if isinstance(store, EventRelay) else None

    @property
    def running(self) -> int:
        return len(self._running)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Mark the background responses a dead process left running ``failed``, and listen for
        cancels from other processes."""
        await self._recover()
        relay = self.relay
        if relay is not None and self._stop_listening is None:
            loop = asyncio.get_running_loop()

            def on_cancel(tenant: str, response_id: str) -> None:
                loop.call_soon_threadsafe(self._cancel_local, tenant, response_id)

            self._stop_listening = await relay.listen_cancels(on_cancel)

    async def aclose(self) -> None:
        """Stop listening; responses still running are cancelled and stored ``failed``."""
        if self._stop_listening is not None:
            stop, self._stop_listening = self._stop_listening, None
            with contextlib.suppress(Exception):
                await stop()
        self._closing = True
        runs = list(self._running.values())
        for run in runs:
            if run.task is not None:
                run.task.cancel()
        for run in runs:
            if run.task is not None:
                with contextlib.suppress(BaseException):
                    await run.task
            await self._end(run, self._interrupted(run))
        for task in list(self._relay_tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _recover(self) -> None:
        store = self.responder.store
        journal = getattr(self.responder.pipeline.billing, "journal", None)
        entries = getattr(journal, "recovered_entries", ())
        if store is None:
            return
        for entry in entries:
            if not getattr(entry, "background", False):
                continue
            try:
                stored = await store.get(entry.tenant, entry.id)
                if stored is None or stored.response.status not in ACTIVE:
                    continue
                error = ResponseErrorInfo("server_error", "The server stopped while the response was running.")
                await store.put(_with(stored, status="failed", error=error))
                self.recovered += 1
            except Exception:
                logger.exception("could not mark background response %s failed", entry.id)

    # -- running ---------------------------------------------------------------------------

    async def submit(self, turn: Turn, lineage: Lineage, route: Route) -> Response:
        """Store the response ``queued`` and start it; the queued Response is returned."""
        store = self.responder.store
        if store is None:
            raise invalid_request("Background mode needs a response store.", "background", "unsupported_parameter")
        request = turn.request
        queued = msgspec.structs.replace(turn.response("queued", []), store=True, background=True)
        stored = StoredResponse(turn.tenant, queued, tuple(lineage.items), request.instructions, turn.tools.raw)
        await store.put(stored)
        run = _Run(turn.tenant, stored)
        key = (turn.tenant, turn.response_id)
        self._running[key] = run
        loop = asyncio.get_running_loop()
        run.task = loop.create_task(self._run(run, turn, lineage, route), name=f"background {turn.response_id}")
        if self.drain is not None:
            self.drain.track(run.task)

        def ended(task: asyncio.Task[None]) -> None:
            if not run.done:  # cancelled before it started: its own ending never ran
                self._track(loop.create_task(self._end(run, self._interrupted(run))))

        run.task.add_done_callback(ended)
        return queued

    def _track(self, task: asyncio.Task[None]) -> None:
        self._relay_tasks.add(task)
        task.add_done_callback(self._relay_tasks.discard)

    async def _run(self, run: _Run, turn: Turn, lineage: Lineage, route: Route) -> None:
        store = self.responder.store
        assert store is not None

        async def emit(event: ev.Event) -> None:
            if isinstance(event, ev.ResponseCreated):
                run.stored = dataclasses.replace(run.stored, response=event.response)
                await store.put(run.stored)
            elif isinstance(event, ev.OutputItemDone) and not isinstance(event.item, HostedItem):
                run.output.append(event.item)
            run.add(Frame(str(type(event).__struct_config__.tag).encode(), encode(event)))
            self._relay_soon(run)

        final: StoredResponse | None = None
        try:
            state = await self.responder.run(turn, lineage, route, emit)
            if state.response.status == "failed":  # the pipeline stores only what did not fail
                final = dataclasses.replace(run.stored, response=state.response)
        except asyncio.CancelledError:
            final = self._interrupted(run)
            raise
        except ResponsesError as exc:  # refused before response.created
            final = _with(run.stored, status="failed", error=ResponseErrorInfo(exc.code or "invalid_request", exc.message))
        except Exception:
            logger.exception("background response %s failed", turn.response_id)
            final = _with(run.stored, status="failed", error=ResponseErrorInfo("server_error", "The server had an error."))
        finally:
            await asyncio.shield(self._end(run, final))

    def _interrupted(self, run: _Run) -> StoredResponse:
        """A cancelled run's final state: ``cancelled``, or ``failed`` when the server is closing."""
        if self._closing:
            error = ResponseErrorInfo("server_error", "The server shut down while the response was running.")
            return _with(run.stored, status="failed", error=error, output=run.output)
        return _with(run.stored, status="cancelled", output=run.output)

    async def _end(self, run: _Run, final: StoredResponse | None) -> None:
        """Store a run's final state (unless the pipeline did) and keep its events for late
        readers. Once per run (a task cancelled before it started never ran its own)."""
        if run.done:
            return
        run.done = True
        key = (run.tenant, run.stored.id)
        self._running.pop(key, None)
        self._finished[key] = run
        store = self.responder.store
        if final is not None and store is not None:
            try:
                await store.put(final)
            except Exception:
                logger.exception("could not store the final state of %s", run.stored.id)
        run.wake()
        self._relay_soon(run)

    def _relay_soon(self, run: _Run) -> None:
        """Write the run's new frames to the relay, one batch at a time, in order."""
        relay = self.relay
        if relay is None or not run.unrelayed or run.relaying:
            return
        run.relaying = True

        async def flush() -> None:
            try:
                while run.unrelayed:
                    batch, run.unrelayed = run.unrelayed, []
                    first, run.relayed = run.relayed, run.relayed + len(batch)
                    await relay.append_events(run.tenant, run.stored.id, first, [(f.type, f.data) for f in batch])
            except Exception:
                logger.exception("could not relay the events of %s", run.stored.id)
            finally:
                run.relaying = False

        self._track(asyncio.get_running_loop().create_task(flush()))

    # -- reading and cancelling -------------------------------------------------------------

    def local(self, tenant: str, response_id: str) -> _Run | None:
        key = (tenant, response_id)
        return self._running.get(key) or self._finished.get(key)

    async def events(self, tenant: str, response_id: str, after: int) -> AsyncIterator[Frame]:
        """The response's events numbered above ``after``, as they come, until it ends. The
        caller has checked that the response is a background one of this tenant."""
        run = self.local(tenant, response_id)
        if run is not None:
            position = max(after + 1, 0)
            while True:
                changed = run.changed
                while position < len(run.frames):
                    yield run.frames[position]
                    position += 1
                if run.done:
                    return
                await changed.wait()
        relay = self.relay
        if relay is None:
            return
        while True:
            got = await relay.read_events(tenant, response_id, after, 1.0)
            for number, kind, data in got:
                after = number
                yield Frame(kind, data)
                if kind in _TERMINAL:
                    return
            if not got:
                stored = await self.responder.store.get(tenant, response_id) if self.responder.store else None
                if stored is None or stored.response.status not in ACTIVE:
                    # ended (cancelled, or failed before any terminal event): nothing more will come
                    for _number, kind, data in await relay.read_events(tenant, response_id, after, 0.0):
                        yield Frame(kind, data)
                    return

    async def cancel(self, tenant: str, response_id: str) -> Response:
        """Cancel a background response; returns it as it ended (``cancelled`` unless it ended first)."""
        store = self.responder.store
        stored = await store.get(tenant, response_id) if store is not None else None
        if stored is None:
            raise ResponsesError(
                f"Response with id '{response_id}' not found.", status=404, code="response_not_found", param="response_id"
            )
        if not stored.response.background:
            raise invalid_request("Only background responses can be cancelled.", "response_id", "invalid_value")
        if stored.response.status not in ACTIVE:
            if stored.response.status == "cancelled":
                return stored.response
            raise invalid_request(
                f"Cannot cancel a response with status '{stored.response.status}'.", "response_id", "invalid_value"
            )
        run = self._running.get((tenant, response_id))
        if run is not None:
            assert run.task is not None
            run.task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(run.task), CANCEL_WAIT_S)
            await self._end(run, self._interrupted(run))
        else:
            relay = self.relay
            heard = await relay.publish_cancel(tenant, response_id) if relay is not None else 0
            if heard:
                ended = await self._wait_ended(tenant, response_id)
                if ended is not None:
                    return ended.response
            # nobody runs it (its process died): it is cancelled here
            latest = await store.get(tenant, response_id) if store is not None else None
            if latest is not None and latest.response.status in ACTIVE and store is not None:
                await store.put(_with(latest, status="cancelled"))
        latest = await store.get(tenant, response_id) if store is not None else None
        return (latest or stored).response

    async def _wait_ended(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The stored response once it has ended, polled until :data:`CANCEL_WAIT_S` (``None``)."""
        store = self.responder.store
        assert store is not None
        deadline = time.monotonic() + CANCEL_WAIT_S
        pause = 0.01
        while time.monotonic() < deadline:
            latest = await store.get(tenant, response_id)
            if latest is None or latest.response.status not in ACTIVE:
                return latest
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)
        return None

    def _cancel_local(self, tenant: str, response_id: str) -> None:
        run = self._running.get((tenant, response_id))
        if run is not None and run.task is not None:
            run.task.cancel()


_TERMINAL = frozenset({b"response.completed", b"response.failed", b"response.incomplete"})


def _with(stored: StoredResponse, *, status: Any, error: ResponseErrorInfo | None = None, output: list[WireItem] | None = None) -> StoredResponse:
    changes: dict[str, Any] = {"status": status}
    if error is not None:
        changes["error"] = error
    if output is not None:
        changes["output"] = list(output)
    return dataclasses.replace(stored, response=msgspec.structs.replace(stored.response, **changes))
