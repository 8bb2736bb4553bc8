"""Mid-turn steering (``response.steer``), sans-I/O.

:class:`Steering` holds one connection's steering state: which responses are active (and may be
steered), the steering input queued for each, and the input that waits for a client's explicit
``response.create`` after its target stopped for tool output. It validates a steer, allocates its
``steer_<32 hex>`` id and answers with the WebSocket-only steering events:

* ``response.steer.accepted`` — validated and queued; the target's :class:`Interrupt` is raised so
  the pipeline stops at its next safe boundary (the target ends ``incomplete``/``steered``, or
  completes when it was already finishing);
* when the target ends: a :class:`Successor` — the target's own request continued from the target
  (``previous_response_id``) with the steering input appended, on the same lane; or, when the
  target stopped for client-owned tool output, ``response.steer.pending`` with ``required_input``
  stubs, and the input is prepended to the client's next ``response.create`` for that parent on
  that lane (:meth:`Steering.prepend`);
* ``response.steer.failed`` — rejected, or accepted but never committed; it carries the original
  input (and the steer id once one was allocated).

Nothing here touches a socket or a task; :class:`~responses_cache.session.session.Session` wires it in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..pipeline.interrupt import Interrupt
from ..protocol import events as ev
from ..protocol.errors import ResponsesError
from ..protocol.ids import new_id
from ..protocol.items import CustomToolCall, Message
from ..protocol.request import CreateResponse, decode_item
from ..storage.state import ResponseState

_STEER_KEYS = frozenset({"type", "previous_response_id", "input"})
_MESSAGE_KEYS = frozenset({"type", "role", "content"})
_PART_TYPES = frozenset({"input_text", "input_image", "input_file"})
SUCCESSOR_FAILED = "We couldn't start the next response. Send this steering input again with response.create."


class SteerRef(msgspec.Struct, frozen=True):
    id: str
    previous_response_id: str


class FailedSteerRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    #: Omitted when the steer was rejected before an id was allocated.
    id: str | None = None
    previous_response_id: str
    input: Any


class SteerError(msgspec.Struct, frozen=True):
    type: str
    code: str
    message: str


class SteerAccepted(ev.Event, tag="response.steer.accepted"):
    steer: SteerRef


class SteerPending(ev.Event, tag="response.steer.pending"):
    steer: SteerRef
    reason: str
    required_input: list[dict[str, str]]


class SteerFailed(ev.Event, tag="response.steer.failed"):
    steer: FailedSteerRef
    error: SteerError


@dataclass(slots=True)
class Steer:
    """One accepted steering submission."""

    id: str
    target: str
    #: The input exactly as the client sent it (returned by ``response.steer.failed``).
    original: Any
    #: Each user message as a JSON input item, in order.
    items: list[bytes]


@dataclass(slots=True)
class Active:
    """A response running on this connection (steerable while it runs)."""

    response_id: str
    lane: str | None
    request: CreateResponse
    #: ``None`` when this response cannot be steered (``steering_not_supported``).
    interrupt: Interrupt | None
    steers: list[Steer] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Successor:
    """The automatic response that continues a steered target."""

    request: CreateResponse
    lane: str | None
    steers: list[Steer]


Finder = Callable[[str], "tuple[str | None, ResponseState] | None"]


class Steering:
    def __init__(self, max_pending: int = 16) -> None:
        self.max_pending = max_pending
        self.active: dict[str, Active] = {}
        #: Per lane: the parent whose explicit continuation gets the queued input, and that input.
        self.awaiting: dict[str | None, tuple[str, list[Steer]]] = {}
        self._seq = 0
        #: Counters (for tests and metrics): steers accepted, and committed into a response.
        self.accepted = 0
        self.committed = 0

    # -- client events ------------------------------------------------------------------------------

    def submit(self, text: str | bytes, find: Finder) -> list[ev.Event]:
        """One ``response.steer`` frame (already known to be a JSON object)."""
        raw = msgspec.json.decode(text)
        target = raw.get("previous_response_id")
        target = target if isinstance(target, str) else ""
        original = raw.get("input", "")
        active = self.active.get(target) if target else None
        found = find(target) if target and active is None else None
        lane = active.lane if active is not None else (found[0] if found is not None else None)
        try:
            items = _validated(raw)
        except _Invalid as exc:
            return [self._failed(None, target, original, lane, "invalid_input", str(exc))]
        if active is None:
            if found is None:
                return [self._failed(None, target, original, None, "response_not_found",
                                     f"Response with id '{target}' not found on this connection.")]
            if found[1].response.status == "completed":
                return [self._failed(None, target, original, lane, "response_already_completed",
                                     f"Response '{target}' has already completed.")]
            return [self._failed(None, target, original, lane, "response_not_active",
                                 f"Response '{target}' is no longer accepting steering input.")]
        if active.interrupt is None:
            return [self._failed(None, target, original, lane, "steering_not_supported",
                                 "Steering is not supported for this response.")]
        if len(active.steers) >= self.max_pending:
            return [self._failed(None, target, original, lane, "too_many_pending_steers",
                                 f"Too much steering input is pending for response '{target}' "
                                 f"(at most {self.max_pending} submissions).")]
        steer = Steer(new_id("steer"), target, original, items)
        active.steers.append(steer)
        active.interrupt.requested = True
        self.accepted += 1
        return [SteerAccepted(steer=SteerRef(steer.id, target), sequence_number=self._next(), stream_id=lane)]

    # -- response lifecycle -------------------------------------------------------------------------

    def activate(self, response_id: str, lane: str | None, request: CreateResponse, supported: bool) -> Interrupt | None:
        """A response starts on ``lane``; returns its interrupt (``None``: it cannot be steered)."""
        steerable = supported and request.conversation is None and not request.context_management
        interrupt = Interrupt() if steerable else None
        self.active[response_id] = Active(response_id, lane, request, interrupt)
        return interrupt

    def finish(self, response_id: str, state: ResponseState | None) -> tuple[Successor | None, list[ev.Event]]:
        """The response ended (``state``: how; ``None`` when it failed before it existed)."""
        active = self.active.pop(response_id, None)
        if active is None or not active.steers:
            return None, []
        steers, lane = active.steers, active.lane
        if state is None or state.response.status == "failed":
            return None, self.fail(steers, lane, "successor_creation_failed", SUCCESSOR_FAILED)
        required = required_input(state)
        if required:
            events: list[ev.Event] = []
            old = self.awaiting.pop(lane, None)
            if old is not None:  # the lane moved on without continuing that parent: give it back
                events += self.fail(old[1], lane, "response_not_active",
                                    f"Response '{old[0]}' is no longer accepting steering input.")
            self.awaiting[lane] = (response_id, steers)
            for steer in steers:
                events.append(SteerPending(
                    steer=SteerRef(steer.id, response_id), reason="waiting_for_required_input",
                    required_input=required, sequence_number=self._next(), stream_id=lane,
                ))
            return None, events
        request = msgspec.structs.replace(
            active.request, input=_array([b for s in steers for b in s.items]),
            previous_response_id=response_id, generate=True,
        )
        return Successor(request, lane, steers), []

    def prepend(self, request: CreateResponse, lane: str | None) -> tuple[CreateResponse, list[Steer]]:
        """The client's explicit continuation of a parent with queued input: that input goes first,
        in submission order. Returns the request to run and the steers it commits."""
        entry = self.awaiting.get(lane)
        if entry is None or request.previous_response_id != entry[0]:
            return request, []
        own = _elements(bytes(request.input))
        if own is None:  # not an input the request could run with: it fails on its own, input stays queued
            return request, []
        del self.awaiting[lane]
        steers = entry[1]
        merged = _array([*(b for s in steers for b in s.items), *own])
        return msgspec.structs.replace(request, input=merged), steers

    def committed_to(self, steers: list[Steer]) -> None:
        self.committed += len(steers)

    def fail(self, steers: list[Steer], lane: str | None, code: str, message: str) -> list[ev.Event]:
        return [self._failed(s.id, s.target, s.original, lane, code, message) for s in steers]

    def clear(self) -> None:
        self.active.clear()
        self.awaiting.clear()

    # -- internals ----------------------------------------------------------------------------------

    def _failed(self, steer_id: str | None, target: str, original: Any, lane: str | None, code: str, message: str) -> SteerFailed:
        return SteerFailed(
            steer=FailedSteerRef(id=steer_id, previous_response_id=target, input=original),
            error=SteerError("invalid_request_error", code, message),
            sequence_number=self._next(),
            stream_id=lane,
        )

    def _next(self) -> int:
        """Steering events are numbered on their own, per connection, from 0."""
        seq, self._seq = self._seq, self._seq + 1
        return seq


def required_input(state: ResponseState) -> list[dict[str, str]]:
    """Stubs of the client-owned tool results ``state`` waits for (identifying fields only)."""
    custom = {i.call_id for i in state.response.output if isinstance(i, CustomToolCall)}
    return [
        {"type": "custom_tool_call_output", "call_id": call_id} if call_id in custom
        else {"type": "function_call_output", "call_id": call_id, "name": name}
        for call_id, name in state.open_calls.items()
    ]


class _Invalid(Exception):
    pass


def _validated(raw: dict[str, Any]) -> list[bytes]:
    """The steer's user messages as JSON items; raises :class:`_Invalid` with the reason."""
    extra = sorted(set(raw) - _STEER_KEYS)
    if extra:
        if "stream_id" in extra:
            raise _Invalid("'stream_id' is not allowed in response.steer; the target response determines the lane.")
        raise _Invalid(f"Unknown parameter: '{extra[0]}'. response.steer accepts only type, previous_response_id and input.")
    target = raw.get("previous_response_id")
    if not isinstance(target, str) or not target:
        raise _Invalid("Missing required parameter: 'previous_response_id'.")
    value = raw.get("input")
    if isinstance(value, str):
        if not value:
            raise _Invalid("'input' must not be empty.")
        return [msgspec.json.encode({"type": "message", "role": "user", "content": value})]
    if not isinstance(value, list) or not value:
        raise _Invalid("'input' must be a string or a non-empty array of user messages.")
    out: list[bytes] = []
    for index, element in enumerate(value):
        if not isinstance(element, dict):
            raise _Invalid(f"input[{index}] must be a message object.")
        keys = sorted(set(element) - _MESSAGE_KEYS)
        if keys:
            raise _Invalid(f"input[{index}] has unsupported field '{keys[0]}'; steering accepts only user messages.")
        if element.get("type", "message") != "message":
            raise _Invalid(f"input[{index}] is a '{element.get('type')}' item; steering accepts only user messages.")
        if element.get("role") != "user":
            raise _Invalid(f"input[{index}] has role {element.get('role')!r}; steering accepts only the 'user' role.")
        content = element.get("content")
        if isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") not in _PART_TYPES:
                    raise _Invalid(f"input[{index}].content may hold only input_text, input_image and input_file parts.")
        elif not isinstance(content, str):
            raise _Invalid(f"input[{index}].content must be a string or an array of content parts.")
        encoded = msgspec.json.encode({"type": "message", **element})
        try:
            item = decode_item(encoded, index)
        except ResponsesError as exc:
            raise _Invalid(exc.message) from None
        if not isinstance(item, Message):  # pragma: no cover - the checks above admit only messages
            raise _Invalid(f"input[{index}] must be a user message.")
        out.append(encoded)
    return out


_raw_list = msgspec.json.Decoder(list[msgspec.Raw])


def _elements(data: bytes) -> list[bytes] | None:
    """A request's ``input`` as JSON items (a string is one user message); ``None``: not an input."""
    if not data or data == b"null":
        return []
    if data[:1] == b'"':
        text = msgspec.json.decode(data, type=str)
        return [msgspec.json.encode({"type": "message", "role": "user", "content": text})]
    try:
        return [bytes(e) for e in _raw_list.decode(data)]
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def _array(elements: list[bytes]) -> msgspec.Raw:
    return msgspec.Raw(b"[" + b",".join(elements) + b"]")
