"""The tracing seam: where a turn's time went, as spans, without a tracing library in the core.

The pipeline and the service call a :class:`Tracer` at stage boundaries: one :class:`TurnSpan`
per turn (:meth:`Tracer.start_turn`), and one :class:`StageSpan` per stage under it (resolve,
validate, each blocking hook, render, the journal writes, the engine and its first token). The
default, :data:`NO_TRACER`, hands out one shared do-nothing span, so a server without tracing
pays a few method calls per turn and nothing else.

:class:`responses_cache.observability.otel.OpenTelemetryTracer` (the ``otel`` extra) implements it with
OpenTelemetry; any other tracing system fits the same two protocols.

A tracer may defer its work: a stage's span can be made when the turn ends, from times taken
when the stage ran (:class:`~responses_cache.observability.otel.OpenTelemetryTracer` does, keeping only the
spans the engine request's trace context needs on the way to the client's answer).

Trace context crosses the process in W3C ``traceparent``/``tracestate`` headers: the edges take
them from the client's request or WebSocket upgrade (:func:`trace_headers`), the turn span
continues that trace, and :meth:`TurnSpan.inject` gives the headers that make the engine's own
spans children of the engine stage (``GenerationRequest.trace_context``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Protocol

#: An attribute value, as OpenTelemetry accepts it.
AttributeValue = str | bool | int | float

#: The W3C trace-context headers (lower case, as ASGI and httpx give them).
TRACE_HEADERS = ("traceparent", "tracestate")


def trace_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace-context headers among a request's ``headers`` (``{}`` when there are none).
    ``headers`` is looked up by lower-case name, as Starlette's and httpx's header maps are."""
    found: dict[str, str] = {}
    for name in TRACE_HEADERS:
        value = headers.get(name)
        if value:
            found[name] = value
    return found


def trace_id_of(headers: Mapping[str, str]) -> str:
    """The trace id a ``traceparent`` header names (``version-traceid-parentid-flags``), or ``""``."""
    parts = headers.get("traceparent", "").split("-")
    if len(parts) >= 4 and len(parts[1]) == 32:
        return parts[1]
    return ""


class StageSpan(Protocol):
    """One stage of a turn. A context manager (an exception leaving it marks it failed), or ended
    explicitly with :meth:`end` when the stage spans several code regions."""

    def set(self, key: str, value: AttributeValue) -> None: ...

    def end(self, error: BaseException | None = None) -> None:
        """End the stage (idempotent); ``error``: what made it fail."""
        ...

    def __enter__(self) -> StageSpan: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class TurnSpan(Protocol):
    """One turn, from finding its parent to its terminal event."""

    @property
    def recording(self) -> bool:
        """Whether attributes set on this span go anywhere (skip computing them when not)."""
        ...

    @property
    def trace_id(self) -> str:
        """The trace's id, 32 hex digits (``""`` when nothing traces)."""
        ...

    def set(self, key: str, value: AttributeValue) -> None: ...

    def stage(self, name: str) -> StageSpan:
        """Start a child span for a stage (concurrent stages, such as the blocking hooks, may
        be open at once)."""
        ...

    def inject(self, stage: StageSpan) -> dict[str, str]:
        """The trace-context headers that make an outgoing request a child of ``stage``."""
        ...

    def end(self, status: str, error: BaseException | None = None) -> None:
        """End the turn (idempotent) with the response's status (``completed``, ``failed``,
        ``incomplete``, ``cancelled``, or ``rejected`` for a turn refused before it began).
        The pipeline calls it once the client has been sent the terminal event, so work a
        tracer leaves to the end (making spans, queueing them for export) is off the turn's
        time; stages still open then end with the turn."""
        ...


class Tracer(Protocol):
    def start_turn(self, carrier: Mapping[str, str], attributes: Mapping[str, AttributeValue]) -> TurnSpan:
        """Start a turn's span, continuing the trace named by ``carrier``'s ``traceparent`` (a
        new trace when it has none)."""
        ...


class _NoStage:
    __slots__ = ()

    def set(self, key: str, value: AttributeValue) -> None:
        pass

    def end(self, error: BaseException | None = None) -> None:
        pass

    def __enter__(self) -> _NoStage:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass


class _NoTurn:
    __slots__ = ()
    recording = False
    trace_id = ""

    def set(self, key: str, value: AttributeValue) -> None:
        pass

    def stage(self, name: str) -> StageSpan:
        return NO_STAGE

    def inject(self, stage: StageSpan) -> dict[str, str]:
        return {}

    def end(self, status: str, error: BaseException | None = None) -> None:
        pass


class NoTracer:
    """Traces nothing: every turn gets the same do-nothing span."""

    def start_turn(self, carrier: Mapping[str, str], attributes: Mapping[str, AttributeValue]) -> TurnSpan:
        return NO_TURN


NO_STAGE = _NoStage()
NO_TURN = _NoTurn()
NO_TRACER = NoTracer()
