"""The WebSocket session, sans-I/O: client events in, turns and error events out.

:class:`Session` owns one connection's lanes (``stream_id``), the FIFO queue per lane, the
in-flight cap, the lifetime and the :class:`ConnectionCache`. It never touches a socket or a task:
the ASGI edge feeds it text frames (:meth:`receive`), starts the turns it hands out
(:meth:`startable`), reports how they ended (:meth:`finished`) and sends what :meth:`drain` returns.
"""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

import msgspec

from .protocol import events as ev
from .protocol.codec import too_deep
from .protocol.errors import (
    ErrorPayload,
    ResponsesError,
    invalid_request,
    previous_response_not_found,
)
from .protocol.items import Item, identity
from .protocol.request import CreateResponse, decode_create
from .state import ResponseState

_STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_IGNORED = frozenset({"response.processed", "response.append"})


@dataclass(frozen=True, slots=True)
class SessionConfig:
    max_in_flight: int = 16
    max_named_lanes: int = 32
    max_queued: int = 1024
    #: Bytes of request frames held by this connection's accepted, unfinished turns (queued or
    #: running). A frame that would pass it gets a 429 ``error`` (a frame alone on an idle
    #: connection is always admitted, up to the message size limit).
    max_queued_bytes: int = 32 * 1024 * 1024
    lifetime_s: float = 3600.0
    #: After the lifetime, turns still running may finish for this long; then the connection is
    #: aborted and its state freed, whatever its writes are doing.
    lifetime_grace_s: float = 60.0
    #: Per-connection cache budget: items and bytes held by the cached conversations.
    max_cached_items: int = 262_144
    max_cached_bytes: int = 256 * 1024 * 1024
    #: Keep each cached response's rendered token log. ``False`` trades CPU for memory: the next
    #: continuation re-renders the conversation once instead of appending to the log.
    retain_token_log: bool = True
    limit_message: str = (
        "Responses websocket connection limit reached ({minutes} minutes). "
        "Create a new websocket connection to continue."
    )


class InputBudget:
    """The process-wide byte budget for request frames held by accepted, unfinished turns, shared
    by every connection's :class:`Session` (sans-I/O: a counter, no locks, one event loop)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self.held = 0
        #: The most ever held at once, and how many frames were refused.
        self.peak = 0
        self.refusals = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.max_bytes:
            self.refusals += 1
            return False
        self.held += size
        self.peak = max(self.peak, self.held)
        return True

    def release(self, size: int) -> None:
        self.held -= size


class _Probe(msgspec.Struct):
    type: Any = None
    stream_id: Any = None


_probe = msgspec.json.Decoder(_Probe)


@dataclass(slots=True)
class PendingTurn:
    """A ``response.create`` accepted on a lane, waiting for its turn to run."""

    request: CreateResponse
    lane: str | None
    seq: int
    #: When the frame arrived (the caller's clock), for the queue-wait metric.
    received_at: float = 0.0
    #: Bytes of the frame it holds (charged to the input budgets until the turn finishes).
    size: int = 0


class ConnectionCache:
    """The latest response of each lane, findable by id. Bounded by the session's budget."""

    def __init__(self) -> None:
        self.latest: dict[str | None, ResponseState] = {}
        self.hits = 0
        self.misses = 0

    def find(self, response_id: str) -> tuple[str | None, ResponseState] | None:
        for lane, state in self.latest.items():
            if state.id == response_id:
                return lane, state
        return None

    def put(self, lane: str | None, state: ResponseState) -> None:
        self.latest.pop(lane, None)
        self.latest[lane] = state  # re-insert: dict order doubles as recency order

    def evict(self, response_id: str) -> None:
        for lane, state in list(self.latest.items()):
            if state.id == response_id:
                del self.latest[lane]

    def clear(self) -> None:
        self.latest.clear()

    def size(self) -> tuple[int, int]:
        """(items, bytes) held, counting shared history once per lane (an upper bound)."""
        items = sum(s.conversation.count for s in self.latest.values())
        nbytes = sum(_total_bytes(s) for s in self.latest.values())
        return items, nbytes


def _total_bytes(state: ResponseState) -> int:
    log = state.token_log
    return state.total_bytes + (4 * log.num_tokens if log is not None else 0)


class Session:
    def __init__(
        self, tenant: str, config: SessionConfig | None = None, *, now: float = 0.0, input_budget: InputBudget | None = None
    ) -> None:
        self.tenant = tenant
        self.input_budget = input_budget
        #: Bytes of frames held by this connection's accepted, unfinished turns.
        self.queued_bytes = 0
        self.config = config or SessionConfig()
        self.cache = ConnectionCache()
        self.deadline = now + self.config.lifetime_s
        self._outbox: list[ev.Event] = []
        self._waiting: deque[PendingTurn] = deque()
        self._running: dict[int, PendingTurn] = {}
        self._active_lanes: set[str | None] = set()
        self._named_lanes: set[str] = set()
        self._seq = 0
        self.in_flight = 0
        self.expired = False
        self.close_code: int | None = None
        self._limit_sent = False

    # -- input ------------------------------------------------------------------------------------

    def receive(self, text: str | bytes, now: float = 0.0) -> None:
        """One client text frame (``now``: the caller's clock, kept for the queue-wait metric)."""
        # The common case, a well-formed response.create, costs one pass over the frame; anything
        # else takes the careful path below, which names what is wrong.
        try:
            fast: CreateResponse | None = decode_create(text)
        except ResponsesError:
            fast = None
        if fast is not None and fast.type == "response.create":
            self._create(text, now, fast.stream_id, fast)
            return
        try:
            probe = _probe.decode(text)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            self._error(invalid_request("The message is not a valid JSON object.", None, "invalid_json"), None)
            return
        kind = probe.type
        if kind is not None and not isinstance(kind, str):  # never hash a non-string tag
            self._error(invalid_request("Invalid type for 'type': expected a string.", "type", "invalid_type"), None)
            return
        if kind in _IGNORED:
            return
        if kind == "response.steer":
            self._steer_unsupported(text)
            return
        if kind != "response.create":
            message = "Missing required parameter: 'type'." if kind is None else f"Unsupported event type: '{kind}'."
            self._error(invalid_request(message, "type", "invalid_value" if kind is not None else "missing_required_parameter"), None)
            return
        self._create(text, now, probe.stream_id, None)

    def _create(self, text: str | bytes, now: float, lane: Any, request: CreateResponse | None) -> None:
        """A ``response.create`` (``request``: already decoded, or ``None``)."""
        if lane is not None and (not isinstance(lane, str) or not _STREAM_ID.fullmatch(lane)):
            self._error(
                invalid_request(
                    "The 'stream_id' field must be a non-empty string with at most 256 characters and may only "
                    "contain letters, numbers, underscores, hyphens, and periods.",
                    "stream_id",
                    "invalid_stream_id",
                ),
                None,
            )
            return
        if self.expired:
            self._limit_reached(lane)
            return
        if lane is not None and lane not in self._named_lanes:
            if len(self._named_lanes) >= self.config.max_named_lanes:
                self._error(
                    invalid_request(
                        "This WebSocket connection has reached its maximum number of distinct stream IDs "
                        f"({self.config.max_named_lanes}). Reuse an existing stream_id or open a new WebSocket "
                        "connection.",
                        "stream_id",
                        "websocket_stream_limit_reached",
                    ),
                    lane,
                )
                return
            self._named_lanes.add(lane)
        if len(self._waiting) >= self.config.max_queued:
            self._error(
                ResponsesError("Too many queued responses on this connection.", status=429, type="rate_limit_error", code="rate_limit_exceeded"),
                lane,
            )
            return
        size = len(text)
        if not self._admit(size):
            self._error(
                ResponsesError(
                    "Too much request input is waiting on this connection (or on this server); "
                    "wait for responses to finish before sending more.",
                    status=429, type="rate_limit_error", code="rate_limit_exceeded",
                ),
                lane,
            )
            return
        try:
            if request is None:
                request = decode_create(text)
            if request.background:
                raise invalid_request("Background mode is not supported over WebSocket.", "background", "unsupported_parameter")
        except ResponsesError as exc:
            self._release_size(size)
            self._error(exc, lane)
            return
        self._seq += 1
        self._waiting.append(PendingTurn(request, lane, self._seq, now, size))

    def _admit(self, size: int) -> bool:
        """Charge a frame to the per-connection and process-wide input budgets."""
        if self.queued_bytes and self.queued_bytes + size > self.config.max_queued_bytes:
            return False
        if self.input_budget is not None and not self.input_budget.take(size):
            return False
        self.queued_bytes += size
        return True

    def _release(self, pending: PendingTurn) -> None:
        self._release_size(pending.size)
        pending.size = 0

    def _release_size(self, size: int) -> None:
        self.queued_bytes -= size
        if self.input_budget is not None:
            self.input_budget.release(size)

    def tick(self, now: float) -> None:
        """Advance the clock: past the deadline, refuse new work and close once idle."""
        if not self.expired and now >= self.deadline:
            self.expired = True
            for pending in self._waiting:
                self._limit_reached(pending.lane)
                self._release(pending)
            self._waiting.clear()
        if self.expired and self.in_flight == 0 and self.close_code is None:
            if not self._limit_sent:  # the client has not been told yet: tell it before closing
                self._limit_reached()
            self.close_code = 1000

    # -- turns ------------------------------------------------------------------------------------

    def startable(self) -> list[PendingTurn]:
        """Turns that may start now: FIFO per lane, one per lane, at most ``max_in_flight``."""
        ready: list[PendingTurn] = []
        blocked: set[str | None] = set(self._active_lanes)
        for pending in list(self._waiting):
            if self.in_flight >= self.config.max_in_flight:
                break
            if pending.lane in blocked:
                continue
            blocked.add(pending.lane)
            self._waiting.remove(pending)
            self._active_lanes.add(pending.lane)
            self.in_flight += 1
            self._running[pending.seq] = pending
            ready.append(pending)
        return ready

    def resolve(self, pending: PendingTurn) -> ResponseState | None:
        """The cached parent of a turn, or ``None`` (the caller may hydrate from the store)."""
        wanted = pending.request.previous_response_id
        if wanted is None:
            return None
        found = self.cache.find(wanted)
        if found is None:
            self.cache.misses += 1
            return None
        self.cache.hits += 1
        return found[1]

    def match_full_input(self, pending: PendingTurn, items: list[Item], tools_fingerprint: bytes) -> tuple[ResponseState, int] | None:
        """For a request without ``previous_response_id``: if its input extends the lane's latest
        conversation (same instructions and tools), the cached state and how many items it covers."""
        state = self.cache.latest.get(pending.lane)
        if state is None or state.response.status == "failed":
            return None
        request = pending.request
        if state.instructions != request.instructions or state.tools.fingerprint != tools_fingerprint:
            return None
        count = state.conversation.count
        if count == 0 or count > len(items):
            return None
        cached = state.conversation.items()
        for mine, theirs in zip(cached, items, strict=False):
            if identity(mine) != identity(theirs):
                return None
        return state, count

    def finished(self, pending: PendingTurn, state: ResponseState | None) -> None:
        """A turn ended: ``state`` is its response's state, ``None`` if it failed before one existed."""
        self.in_flight -= 1
        self._active_lanes.discard(pending.lane)
        self._running.pop(pending.seq, None)
        self._release(pending)
        ok = state is not None and state.response.status != "failed"
        if ok:
            assert state is not None
            if not self.config.retain_token_log and state.token_log is not None:
                state = dataclasses.replace(state, token_log=None, fingerprint=None)
            self.cache.put(pending.lane, state)
            self._enforce_budget()
            return
        parent = pending.request.previous_response_id
        if parent is None:
            return
        found = self.cache.find(parent)
        if found is not None and found[0] == pending.lane:
            self.cache.evict(parent)  # same-lane continuation failed; a cross-lane fork keeps it

    def _enforce_budget(self) -> None:
        cfg = self.config
        while self.cache.latest:
            items, nbytes = self.cache.size()
            if items <= cfg.max_cached_items and nbytes <= cfg.max_cached_bytes:
                return
            oldest = next(iter(self.cache.latest))
            del self.cache.latest[oldest]

    def close(self) -> None:
        """The socket closed: drop every piece of connection-local state."""
        self.cache.clear()
        for pending in [*self._waiting, *self._running.values()]:
            self._release(pending)
        self._waiting.clear()
        self._running.clear()
        self._outbox.clear()
        self._active_lanes.clear()
        self._named_lanes.clear()

    # -- output -----------------------------------------------------------------------------------

    def not_found(self, pending: PendingTurn) -> None:
        assert pending.request.previous_response_id is not None
        self._error(previous_response_not_found(pending.request.previous_response_id), pending.lane)

    def error(self, exc: ResponsesError, lane: str | None) -> None:
        self._error(exc, lane)

    def drain(self) -> list[ev.Event]:
        out, self._outbox = self._outbox, []
        return out

    def _error(self, exc: ResponsesError, lane: str | None) -> None:
        self._outbox.append(ev.ErrorEvent(status=exc.status, error=exc.payload, stream_id=lane))

    def _limit_reached(self, lane: str | None = None) -> None:
        self._limit_sent = True
        minutes = round(self.config.lifetime_s / 60)
        self._outbox.append(
            ev.ErrorEvent(
                status=400,
                error=ErrorPayload(
                    "invalid_request_error", "websocket_connection_limit_reached",
                    self.config.limit_message.format(minutes=minutes), None,
                ),
                stream_id=lane,
            )
        )

    def _steer_unsupported(self, text: str | bytes) -> None:
        try:
            raw = msgspec.json.decode(text)  # already known to be a JSON object
        except RecursionError:
            self._error(too_deep(), None)
            return
        target = raw.get("previous_response_id")
        target = target if isinstance(target, str) else ""
        found = self.cache.find(target) if target else None
        self._outbox.append(
            SteerFailed(
                # The original input goes back to the client, unchanged; no steer id was allocated.
                steer={"previous_response_id": target, "input": raw.get("input", "")},
                error=ErrorPayload(
                    "invalid_request_error", "steering_not_supported",
                    "Steering is not supported by this server.", None,
                ),
                sequence_number=0,
                stream_id=found[0] if found is not None else None,
            )
        )


class SteerFailed(ev.Event, tag="response.steer.failed"):
    steer: dict[str, Any]
    error: ErrorPayload
