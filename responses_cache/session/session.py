"""The WebSocket session, sans-I/O: client events in, turns and error events out.

:class:`Session` owns one connection's lanes (``stream_id``), the FIFO queue per lane, the
in-flight cap, the lifetime and the :class:`ConnectionCache`. It never touches a socket or a task:
the ASGI edge feeds it text frames (:meth:`receive`), starts the turns it hands out
(:meth:`startable`), reports how they ended (:meth:`finished`) and sends what :meth:`drain` returns.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import msgspec

from ..conversation import Conversation
from ..conversation.compaction import history_start, replaces_history
from ..pipeline.append import AppendChannel, append_not_enabled
from ..pipeline.interrupt import Interrupt
from ..pipeline.truncate import kept_always
from ..protocol import events as ev
from ..protocol.codec import too_deep
from ..protocol.errors import (
    ErrorPayload,
    ResponsesError,
    invalid_request,
    previous_response_not_found,
)
from ..protocol.items import FunctionCallOutput, Item
from ..protocol.request import CreateResponse, decode_create, decode_input
from ..storage.references import ItemIndex
from ..storage.state import ResponseState, rebased
from ..tokens.key import reusable_prefix
from .steering import SUCCESSOR_FAILED, Steer, Steering

if TYPE_CHECKING:
    from ..tokens.base import Renderer

_STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")


def frame_size(text: str | bytes) -> int:
    """A frame's size on the wire, in bytes (UTF-8): the unit of the limits on what a client
    sends (a text frame arrives decoded, and a character is 1 to 4 bytes)."""
    if isinstance(text, bytes) or text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def held_frame(text: str | bytes) -> str | bytes:
    """The frame as its turn keeps it until it runs: an ASCII text as it is (one byte a
    character), any other as its UTF-8 bytes, never wider than it was sent (Python holds a text
    with one emoji at 4 bytes a character)."""
    if isinstance(text, bytes) or text.isascii():
        return text
    return text.encode("utf-8", "surrogatepass")


def frame_cost(text: str | bytes, size: int) -> int:
    """What an accepted ``response.create`` of ``size`` wire bytes may hold in memory until it
    finishes, the unit of the per-connection and process input budgets: the frame while it waits
    (:func:`held_frame`, ``size`` bytes), then the input decoded from it. Decoded strings are no
    longer than the frame's text and no wider than its characters, so they take at most what the
    whole text took as Python held it (``sys.getsizeof``: 1, 2 or 4 bytes a character); a
    non-ASCII string also gets its UTF-8 form attached once it is tokenized (``size`` more).
    An ASCII frame costs its size."""
    if isinstance(text, bytes) or text.isascii():
        return size
    return size + sys.getsizeof(text)
_IGNORED = frozenset({"response.processed"})


@dataclass(frozen=True, slots=True)
class SessionConfig:
    max_in_flight: int = 16
    max_named_lanes: int = 32
    max_queued: int = 1024
    #: Bytes held by this connection's accepted, unfinished turns (queued or running): each is
    #: charged its :func:`frame_cost` (its frame, then the input decoded from it). A frame that
    #: would pass it gets a 429 ``error`` (a frame alone on an idle connection is always
    #: admitted, up to the message size limit).
    max_queued_bytes: int = 32 * 1024 * 1024
    lifetime_s: float = 3600.0
    #: After the lifetime, turns still running may finish for this long; then the connection is
    #: aborted and its state freed, whatever its writes are doing.
    lifetime_grace_s: float = 60.0
    #: Per-connection cache budget: items and bytes held by the cached conversations.
    max_cached_items: int = 262_144
    max_cached_bytes: int = 256 * 1024 * 1024
    #: Items of this connection's responses findable by ``item_reference`` (most recent kept),
    #: at most this many and this many encoded bytes (counted in the process cache budget too).
    max_referenceable_items: int = 65_536
    max_referenceable_bytes: int = 32 * 1024 * 1024
    #: Keep each cached response's rendered token log. ``False`` trades CPU for memory: the next
    #: continuation re-renders the conversation once instead of appending to the log.
    retain_token_log: bool = True
    #: A lane's superseded responses stay findable by id for a short grace period, so a fork
    #: sent at the same moment as a continuation on the parent's lane still finds its parent.
    #: Bounded by count and by time; only a response its successor continues is kept (they
    #: share their history, so this costs little).
    superseded_keep: int = 8
    superseded_grace_s: float = 10.0
    #: Steering submissions queued per target response (more get ``too_many_pending_steers``).
    max_pending_steers: int = 16
    #: The ``response.append`` extension (off by default): a create with ``"append": true`` keeps
    #: its response open across function calls for the client to append their outputs to. Off,
    #: such a create is refused and ``response.append`` frames are ignored (the legacy event).
    allow_append: bool = False
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


class _AppendFrame(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    response_id: Any = None
    input: msgspec.Raw = msgspec.Raw(b"null")


_append_frame = msgspec.json.Decoder(_AppendFrame)


def _append_input(message: str, param: str) -> ResponsesError:
    return invalid_request(message, param, "invalid_append_input")


@dataclass(slots=True)
class PendingTurn:
    """A ``response.create`` accepted on a lane, waiting for its turn to run."""

    request: CreateResponse
    lane: str | None
    seq: int
    #: When the frame arrived (the caller's clock), for the queue-wait metric.
    received_at: float = 0.0
    #: The id of the response this turn runs as (set by :meth:`Session.activate`).
    response_id: str = ""
    #: Steering input this turn commits (an automatic successor, or a prepended continuation).
    steers: list[Steer] = field(default_factory=list)
    #: An automatic successor of a steered response (the client sent no ``response.create``).
    successor: bool = False
    #: What it is charged in the input budgets until the turn finishes (:func:`frame_cost`: its
    #: frame, then the input decoded from it).
    size: int = 0
    #: Refused before it ran (a quota): its parent stays cached for the client's retry.
    never_ran: bool = False
    #: Sent its whole input, matched against the lane's cached conversation: its client reads
    #: every item of that conversation each turn, so the lane's history is kept unpacked.
    resent: bool = False


class SessionState(Enum):
    """Where a connection is in its life."""

    #: Accepting work.
    OPEN = "open"
    #: Past its lifetime: new work is refused (``websocket_connection_limit_reached``); turns
    #: already running finish.
    DRAINING = "draining"
    #: Past its lifetime and idle: the edge closes the socket (1000; 1001 when the server drains).
    CLOSING = "closing"


#: The close code of a connection the server let go because it drains: RFC 6455's "going away",
#: one of the codes the SDKs reconnect on (see docs/deploy.md).
GOING_AWAY = 1001
_SHUTDOWN_MESSAGE = "This server is shutting down. Create a new websocket connection to continue."


@dataclass(slots=True)
class TurnView:
    """The connection cache as one pending turn sees it
    (:class:`~responses_cache.core.responder.TurnCache`)."""

    session: Session
    pending: PendingTurn
    now: float

    @property
    def items(self) -> ItemIndex:
        return self.session.items

    def cached_parent(self) -> tuple[ResponseState, bool] | None:
        return self.session.find_cached_parent(self.pending, self.now)

    def full_input_match(
        self, items: list[Item], tools_fingerprint: bytes, renderer: Renderer | None
    ) -> tuple[ResponseState, int] | None:
        return self.session.match_full_input(self.pending, items, tools_fingerprint, renderer)


class ConnectionCache:
    """The latest response of each lane, findable by id, plus the last few responses a lane
    superseded (for a grace period). Bounded by the session's budget.

    A response put here has the history behind its newest conversation node packed
    (:meth:`~responses_cache.conversation.Conversation.pack_behind`): the nodes it added since
    the lane's last response, once each, so a turn packs about its own items and every reader
    still gets them, unpacked on demand. Not packed: a response put with ``pack=False`` (its
    client resends its whole input, which is matched item by item against the history every
    turn), and with ``pack_stored=False`` a ``store: true`` response (the response store keeps
    the very same items in this process, so packing them would free nothing)."""

    def __init__(self, keep_superseded: int = 0, grace_s: float = 0.0, *, pack_stored: bool = True) -> None:
        #: Each lane's latest response; dict order doubles as recency order (oldest first).
        self._latest: dict[str | None, ResponseState] = {}
        #: (lane, state, expires at), oldest first; at most ``keep_superseded`` entries.
        self._superseded: deque[tuple[str | None, ResponseState, float]] = deque(maxlen=max(keep_superseded, 1))
        self._keep = keep_superseded
        self._grace_s = grace_s
        self._pack_stored = pack_stored

    @property
    def latest(self) -> Mapping[str | None, ResponseState]:
        """Each lane's latest response (read-only; least recently updated first)."""
        return MappingProxyType(self._latest)

    @property
    def superseded(self) -> tuple[tuple[str | None, ResponseState, float], ...]:
        """The superseded responses kept for the grace period, ``(lane, state, expires at)``,
        oldest first (some may have expired: :meth:`find` drops them)."""
        return tuple(self._superseded)

    def latest_on(self, lane: str | None) -> ResponseState | None:
        """The latest response on ``lane`` (``None``: none cached)."""
        return self._latest.get(lane)

    def parent(self, response_id: str, now: float = 0.0) -> tuple[ResponseState, bool] | None:
        """The response ``response_id`` to continue from, and whether its lane has moved on since
        (found among the superseded ones, inside the grace period); ``None``: not cached."""
        found = self.find(response_id, now)
        if found is None:
            return None
        lane, state = found
        return state, self._latest.get(lane) is not state

    def find(self, response_id: str, now: float = 0.0) -> tuple[str | None, ResponseState] | None:
        for lane, state in self._latest.items():
            if state.id == response_id:
                return lane, state
        self._expire(now)
        for lane, state, _ in reversed(self._superseded):
            if state.id == response_id:
                return lane, state
        return None

    def put(self, lane: str | None, state: ResponseState, now: float = 0.0, *, pack: bool = True) -> None:
        old = self._latest.pop(lane, None)
        self._latest[lane] = state  # re-insert: dict order doubles as recency order
        if old is not None and self._keep > 0 and _descends(state.conversation, old.conversation):
            self._superseded.append((lane, old, now + self._grace_s))
        self._expire(now)
        if pack and (self._pack_stored or not state.store):
            state.conversation.pack_behind()

    def evict(self, response_id: str) -> None:
        for lane, state in list(self._latest.items()):
            if state.id == response_id:
                del self._latest[lane]
        if any(state.id == response_id for _, state, _ in self._superseded):
            kept = [entry for entry in self._superseded if entry[1].id != response_id]
            self._superseded.clear()
            self._superseded.extend(kept)

    def shrink_to(self, max_items: int, max_bytes: int) -> None:
        """Over ``max_items`` or ``max_bytes`` (see :meth:`size`): drop the superseded responses
        first, then lanes' latest responses, least recently updated first, until it fits."""
        while self._latest:
            items, nbytes = self.size()
            if items <= max_items and nbytes <= max_bytes:
                return
            self._superseded.clear()  # over budget: the grace period is the first to go
            del self._latest[next(iter(self._latest))]

    def clear(self) -> None:
        self._latest.clear()
        self._superseded.clear()

    def size(self) -> tuple[int, int]:
        """(items, bytes) held by the lanes' latest responses, counting shared history once per
        lane (an upper bound). Superseded responses share their history with their successor and
        are bounded by count, so they are not counted; they are the first to go over budget."""
        items = sum(s.conversation.count for s in self._latest.values())
        nbytes = sum(_total_bytes(s) for s in self._latest.values())
        return items, nbytes

    def _expire(self, now: float) -> None:
        while self._superseded and self._superseded[0][2] <= now:
            self._superseded.popleft()


def _unanswered(items: list[Item], pending: tuple[str, ...]) -> ResponsesError | None:
    """Why ``items`` do not answer exactly the ``pending`` calls, one output each (``None``: they do)."""
    answered: set[str] = set()
    for index, item in enumerate(items):
        if not isinstance(item, FunctionCallOutput):
            return _append_input("Only function_call_output items can be appended to a response.", f"input[{index}]")
        if item.call_id not in pending:
            return _append_input(
                f"No function call with call_id '{item.call_id}' is waiting for output in this response.",
                f"input[{index}].call_id",
            )
        if item.call_id in answered:
            return _append_input(f"Duplicate output for call_id '{item.call_id}'.", f"input[{index}].call_id")
        answered.add(item.call_id)
    missing = [c for c in pending if c not in answered]
    if missing:
        return _append_input(
            "Missing function_call_output for call_id " + ", ".join(f"'{c}'" for c in missing) + ".", "input"
        )
    return None


def _descends(child: Conversation, parent: Conversation) -> bool:
    """True when ``child`` extends ``parent``'s very nodes (so keeping ``parent`` costs little).
    O(nodes added since), a couple per turn."""
    node: Conversation | None = child
    while node is not None and node.count > parent.count:
        node = node.parent
    return node is parent


def _total_bytes(state: ResponseState) -> int:
    log = state.token_log
    return state.total_bytes + (4 * log.num_tokens if log is not None else 0)


class Session:
    def __init__(
        self,
        tenant: str,
        config: SessionConfig | None = None,
        *,
        now: float = 0.0,
        input_budget: InputBudget | None = None,
        pack_stored: bool = True,
    ) -> None:
        self.tenant = tenant
        self.input_budget = input_budget
        #: Bytes held by this connection's accepted, unfinished turns (their :func:`frame_cost`).
        self.queued_bytes = 0
        self.config = config or SessionConfig()
        #: ``pack_stored``: see :class:`ConnectionCache` (``False`` where the response store
        #: keeps ``store: true`` items in this process).
        self.cache = ConnectionCache(
            self.config.superseded_keep, self.config.superseded_grace_s, pack_stored=pack_stored
        )
        #: The connection's items by id, for ``item_reference`` inputs (store true or false).
        self.items = ItemIndex(self.config.max_referenceable_items, max_bytes=self.config.max_referenceable_bytes)
        self.deadline = now + self.config.lifetime_s
        self._outbox: list[ev.Event] = []
        self._waiting: deque[PendingTurn] = deque()
        self._running: dict[int, PendingTurn] = {}
        self._active_lanes: set[str | None] = set()
        self._named_lanes: set[str] = set()
        self._seq = 0
        self.in_flight = 0
        self.state = SessionState.OPEN
        self._limit_sent = False
        #: The server drains (:meth:`shutdown`): the connection closes with 1001, not 1000.
        self.going_away = False
        self.steering = Steering(self.config.max_pending_steers)
        #: Responses that opted in to ``response.append``, while they run: response id → (lane, channel).
        self._appendable: dict[str, tuple[str | None, AppendChannel]] = {}

    # -- input ------------------------------------------------------------------------------------

    def receive(self, text: str | bytes, now: float = 0.0, size: int | None = None, cost: int | None = None) -> None:
        """One client text frame (``now``: the caller's clock, kept for the queue-wait metric;
        ``size``: its :func:`frame_size`, ``cost``: its :func:`frame_cost`, when the caller has
        them already). A non-ASCII text is held as its UTF-8 (:func:`held_frame`)."""
        if size is None:
            size = frame_size(text)
        if cost is None:
            cost = frame_cost(text, size)
        text = held_frame(text)
        # The common case, a well-formed response.create, costs one pass over the frame; anything
        # else takes the careful path below, which names what is wrong.
        try:
            fast: CreateResponse | None = decode_create(text)
        except ResponsesError:
            fast = None
        if fast is not None and fast.type == "response.create":
            self._create(text, cost, now, fast.stream_id, fast)
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
        if kind in _IGNORED or (kind == "response.append" and not self.config.allow_append):
            return  # the legacy response.append is ignored unless the extension is on
        if kind == "response.append":
            try:
                self._append(text)
            except RecursionError:
                self._error(too_deep(), None)
            return
        if kind == "response.steer":
            try:
                self._outbox.extend(self.steering.submit(text, self.cache.find))
            except RecursionError:
                self._error(too_deep(), None)
            return
        if kind != "response.create":
            message = "Missing required parameter: 'type'." if kind is None else f"Unsupported event type: '{kind}'."
            self._error(invalid_request(message, "type", "invalid_value" if kind is not None else "missing_required_parameter"), None)
            return
        self._create(text, cost, now, probe.stream_id, None)

    def _create(self, text: str | bytes, size: int, now: float, lane: Any, request: CreateResponse | None) -> None:
        """A ``response.create`` (``request``: already decoded, or ``None``; ``size``: what it is
        charged, its :func:`frame_cost`)."""
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
            if request.append and not self.config.allow_append:
                raise append_not_enabled()
        except ResponsesError as exc:
            self._release_size(size)
            self._error(exc, lane)
            return
        self._seq += 1
        self._waiting.append(PendingTurn(request, lane, self._seq, now, size=size))

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
        if self.state is SessionState.OPEN and now >= self.deadline:
            self.state = SessionState.DRAINING
            for pending in self._waiting:
                self._limit_reached(pending.lane)
                self._release(pending)
            self._waiting.clear()
        if self.state is SessionState.DRAINING and self.in_flight == 0:
            if not self._limit_sent:  # the client has not been told yet: tell it before closing
                self._limit_reached()
            self.state = SessionState.CLOSING

    def shutdown(self) -> None:
        """The server drains: as past the lifetime, new and queued work is refused
        (``websocket_connection_limit_reached``, which Codex answers by reconnecting and resending)
        and running turns finish; once idle the connection closes with :data:`GOING_AWAY`, with
        no error event when nothing was refused."""
        if self.state is not SessionState.OPEN:
            return  # past its lifetime already: it closes as it was going to
        self.going_away = True
        self._limit_sent = True  # an idle connection gets only the close
        self.deadline = -float("inf")
        self.tick(self.deadline)

    @property
    def expired(self) -> bool:
        """Past the connection's lifetime: new work is refused."""
        return self.state is not SessionState.OPEN

    @property
    def close_code(self) -> int | None:
        """The WebSocket close code once the edge should close the socket (``None`` before)."""
        if self.state is not SessionState.CLOSING:
            return None
        return GOING_AWAY if self.going_away else 1000

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
            if not pending.successor:
                pending.request, pending.steers = self.steering.prepend(pending.request, pending.lane)
            self._active_lanes.add(pending.lane)
            self.in_flight += 1
            self._running[pending.seq] = pending
            ready.append(pending)
        return ready

    def find_cached_parent(self, pending: PendingTurn, now: float = 0.0) -> tuple[ResponseState, bool] | None:
        """The cached parent of a turn and whether it was found superseded (in the grace period),
        or ``None`` (the caller may hydrate from the store). Hits and misses are counted by the
        caller, in its :class:`~responses_cache.observability.metrics.Metrics`."""
        wanted = pending.request.previous_response_id
        if wanted is None:
            return None
        return self.cache.parent(wanted, now)

    def turn_cache(self, pending: PendingTurn, now: float) -> TurnView:
        """This connection's cache as ``pending`` sees it (what the service resolves parents in)."""
        return TurnView(self, pending, now)

    def match_full_input(
        self, pending: PendingTurn, items: list[Item], tools_fingerprint: bytes, renderer: Renderer | None
    ) -> tuple[ResponseState, int] | None:
        """For a request without ``previous_response_id`` (same instructions and tools as the lane's
        latest response): the parent to run it from and how many leading input items it covers.

        The match runs while the input's items render exactly like the cached conversation's
        (equal :func:`~responses_cache.tokens.key.render_key`) and stops at the first item that
        does not; the rest is rendered from there. The parent returned holds the client's own
        items (see :func:`~responses_cache.storage.state.rebased`), so what is stored is what was sent.
        """
        state = self.cache.latest_on(pending.lane)
        if state is None or state.response.status == "failed":
            return None
        request = pending.request
        if state.instructions != request.instructions or state.tools.fingerprint != tools_fingerprint:
            return None
        # A client that resends its whole input has every item compared each turn: its lane's
        # history is unpacked once, here, and no longer packed (see ``PendingTurn.resent``).
        state.conversation.unpack_all()
        cached = state.conversation.items()
        skip = 0
        ahead: list[Item] = []
        if cached and replaces_history(cached[0]):
            # The cached conversation starts at an automatic compaction's item: a client that kept
            # the items before it (not dropping them, as it may) is matched from that item on.
            start = history_start(items)
            if start and items[start] == cached[0]:
                skip = start
        elif state.client_offset and len(items) > state.client_offset:
            # ``truncation: "auto"`` cut the cached conversation: the client still sends what was
            # dropped; match the kept system/developer messages, then from where the cut fell.
            ahead = [i for i in items[: state.client_offset] if kept_always(i)]
            if len(ahead) == state.kept_ahead:
                skip = state.client_offset
            else:
                ahead = []
        view = [*ahead, *items[skip:]] if skip else items
        count, identical = reusable_prefix(cached, view, state.token_log)
        if count <= len(ahead):
            return None
        pending.resent = True
        return rebased(state, view, count, identical, renderer), skip + count - len(ahead)

    def finished(self, pending: PendingTurn, state: ResponseState | None, now: float = 0.0) -> None:
        """A turn ended: ``state`` is its response's state, ``None`` if it failed before one existed
        (``now``: the caller's clock, for the superseded responses' grace period)."""
        self.in_flight -= 1
        self._active_lanes.discard(pending.lane)
        self._running.pop(pending.seq, None)
        self._appendable.pop(pending.response_id, None)
        self._release(pending)
        ok = state is not None and state.response.status != "failed"
        if ok:
            assert state is not None
            if not self.config.retain_token_log and state.token_log is not None:
                state = dataclasses.replace(state, token_log=None, fingerprint=None)
            self.cache.put(pending.lane, state, now, pack=not pending.resent)
            self.cache.shrink_to(self.config.max_cached_items, self.config.max_cached_bytes)
        self._steered(pending, state, now)
        if ok:
            return
        parent = pending.request.previous_response_id
        if parent is None or pending.never_ran:
            return
        found = self.cache.find(parent, now)
        if found is not None and found[0] == pending.lane:
            self.cache.evict(parent)  # same-lane continuation failed; a cross-lane fork keeps it

    # -- steering (see :mod:`responses_cache.session.steering`) ----------------------------------------------

    def activate(self, pending: PendingTurn, response_id: str, supported: bool) -> Interrupt | None:
        """``pending`` runs as ``response_id`` and may be steered until it ends; returns the
        interrupt the pipeline checks (``None``: this response cannot be steered)."""
        pending.response_id = response_id
        return self.steering.activate(response_id, pending.lane, pending.request, supported)

    def appendable(self, pending: PendingTurn) -> AppendChannel | None:
        """The channel ``response.append`` feeds, for a turn that opted in (after :meth:`activate`)."""
        if not pending.request.append or not self.config.allow_append:
            return None
        channel = AppendChannel()
        self._appendable[pending.response_id] = (pending.lane, channel)
        return channel

    def _append(self, text: str | bytes) -> None:
        """A ``response.append`` (the extension is on): validate it against the calls its response
        waits for and hand the outputs over; or answer with an ``error`` event."""
        try:
            frame = _append_frame.decode(text)
        except msgspec.ValidationError as exc:
            self._error(invalid_request(f"Invalid response.append: {exc}.", None, "invalid_value"), None)
            return
        response_id = frame.response_id
        if response_id is None or response_id == "":
            self._error(
                invalid_request("Missing required parameter: 'response_id'.", "response_id", "missing_required_parameter"), None
            )
            return
        if not isinstance(response_id, str):
            self._error(invalid_request("Invalid type for 'response_id': expected a string.", "response_id", "invalid_type"), None)
            return
        found = self._appendable.get(response_id)
        lane = found[0] if found is not None else None
        if found is None or not found[1].awaiting:
            message = (
                f"Response '{response_id}' is generating; append its tool outputs after response.awaiting_input."
                if found is not None
                else f"No response with id '{response_id}' is waiting for input on this connection."
            )
            self._error(invalid_request(message, "response_id", "response_not_awaiting_input"), lane)
            return
        channel = found[1]
        try:
            items = decode_input(frame.input)
        except ResponsesError as exc:
            self._error(exc, lane)
            return
        problem = _unanswered(items, channel.pending)
        if problem is not None:
            self._error(problem, lane)
            return
        channel.deliver(items)

    def rejected(self, pending: PendingTurn, exc: ResponsesError) -> None:
        """A turn failed before ``response.created``: the client's own request gets the ``error``
        event; steering input it was to commit comes back as ``response.steer.failed``."""
        if not pending.successor:
            self._error(exc, pending.lane)
        self._outbox.extend(self.steering.fail(pending.steers, pending.lane, "successor_creation_failed", SUCCESSOR_FAILED))
        pending.steers = []

    def _steered(self, pending: PendingTurn, state: ResponseState | None, now: float) -> None:
        if pending.steers and state is not None:  # the turn's response.created committed them
            self.steering.committed_to(pending.steers)
        if not pending.response_id:
            return
        successor, events = self.steering.finish(pending.response_id, state)
        self._outbox.extend(events)
        if successor is not None and self.expired:  # past the connection's lifetime: nothing new starts
            self._outbox.extend(
                self.steering.fail(successor.steers, successor.lane, "successor_creation_failed", SUCCESSOR_FAILED)
            )
        elif successor is not None:
            self._seq += 1
            # First in line on its lane: the successor continues the target before anything queued.
            self._waiting.appendleft(
                PendingTurn(successor.request, successor.lane, self._seq, now, steers=successor.steers, successor=True)
            )

    @property
    def cached_bytes(self) -> int:
        """Bytes this connection caches: its lanes' responses and its referenceable items (what
        the process-wide :class:`~responses_cache.session.budget.CacheBudget` charges it)."""
        return self.cache.size()[1] + self.items.nbytes

    def drop_cache(self) -> None:
        """Give up every cached response and referenceable item (the process-wide budget needs
        the room): a later continuation hydrates from the store, or is not found."""
        self.cache.clear()
        self.items.clear()

    def close(self) -> None:
        """The socket closed: drop every piece of connection-local state."""
        self.drop_cache()
        self.steering.clear()
        self._appendable.clear()
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
        self._outbox.append(ev.ErrorEvent(status=exc.status, error=exc.payload, stream_id=lane, headers=exc.headers))

    def _limit_reached(self, lane: str | None = None) -> None:
        self._limit_sent = True
        minutes = round(self.config.lifetime_s / 60)
        message = _SHUTDOWN_MESSAGE if self.going_away else self.config.limit_message.format(minutes=minutes)
        self._outbox.append(
            ev.ErrorEvent(
                status=400,
                error=ErrorPayload("invalid_request_error", "websocket_connection_limit_reached", message, None),
                stream_id=lane,
            )
        )
