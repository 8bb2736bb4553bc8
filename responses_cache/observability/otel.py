"""OpenTelemetry traces and metrics (``pip install 'responses-cache[otel]'``).

:class:`OpenTelemetryTracer` implements the :mod:`responses_cache.observability.tracing` seam: a ``SERVER``
span per turn, continuing the client's W3C trace, with a child span per pipeline stage, and the
engine stage's context injected into the engine request (``traceparent``), so an engine that
traces (vLLM ``--otlp-traces-endpoint``) puts its spans under ours.

:class:`OpenTelemetryMetrics` implements :class:`~responses_cache.observability.metrics.Metrics` with the
same names as :class:`~responses_cache.observability.metrics.PrometheusMetrics` (``responses_cache_<name>``;
counters without ``_total``, which a Prometheus exporter adds back), so a dashboard reads either.

Both use the global providers unless given their own (``tracer_provider=``, ``meter_provider=``);
with only ``opentelemetry-api`` installed and no SDK configured, they record nothing.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Collection, Mapping
from time import time_ns
from types import TracebackType
from typing import Any, Literal

from .metrics import Labels
from .tracing import NO_STAGE, AttributeValue, StageSpan, TurnSpan

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("responses_cache.observability.otel needs `pip install 'responses-cache[otel]'`") from exc

__all__ = ["OpenTelemetryMetrics", "OpenTelemetryTracer", "configure_from_environment"]

_PROPAGATOR = TraceContextTextMapPropagator()
#: Stages whose span is a call out of the process (the engine request).
_CLIENT_STAGES = frozenset({"engine"})
#: The turn's final statuses that are failures.
_FAILED = frozenset({"failed", "rejected"})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("responses-cache")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "0"


class _Stage:
    """A stage of a recorded turn: two clock reads and its attributes while the turn runs; it
    becomes a span (or, for a stage without a span of its own, an attribute of the turn span)
    when the turn ends (:meth:`_Turn.end`)."""

    __slots__ = ("attributes", "context", "end_ns", "error", "name", "span", "start_ns")

    def __init__(self, name: str) -> None:
        self.name = name
        self.start_ns = time_ns()
        self.end_ns = 0
        self.attributes: dict[str, AttributeValue] | None = None
        self.error: BaseException | None = None
        #: The stage's span, started ahead of the turn's end only when a request carries its
        #: context out of the process (:meth:`_Turn.inject`: the engine stage) and the SDK
        #: must make it; or, where spans are made finished (:class:`_Finished`), only its
        #: span context and the sampler's attributes then, the span made when the turn ends.
        self.span: Any = None
        self.context: tuple[Any, Mapping[str, Any] | None] | None = None

    def set(self, key: str, value: AttributeValue) -> None:
        if self.attributes is None:
            self.attributes = {key: value}
        else:
            self.attributes[key] = value

    def end(self, error: BaseException | None = None) -> None:
        if not self.end_ns:
            self.end_ns = time_ns()
            self.error = error

    def __enter__(self) -> _Stage:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end(exc)


class _Finished:
    """Spans made finished: when a turn ends, its span and each stage's become an SDK
    ``ReadableSpan`` with their recorded times, handed straight to the provider's span
    processors, instead of spans started and ended through ``Tracer.start_span`` (which builds a
    mutable span, its bounded attribute and event lists, their locks, and a second, read-only
    copy for the processors: about three times the work, and more objects for the garbage
    collector while the spans wait in an export queue).

    A span is what ``start_span`` would make: the sampler is asked (a span it does not sample is
    not made: the accepted processors export sampled spans only), the ids come from the
    tracer's id generator, the trace flags, trace state, resource and instrumentation scope are
    what ``start_span`` gives, a failed span has the ``exception`` event and error status
    ``record_exception`` and ``set_status`` give. The turn's span context is decided when the
    turn starts (:meth:`open`: its trace id goes on log lines), the engine stage's when its
    request needs it (:meth:`_Turn.inject`); the spans are made when the turn ends. What this
    skips, and why that is safe, decides where it is used (:func:`_finished_for`): processors'
    ``on_start`` (only the SDK's batch and simple processors are accepted, whose ``on_start``
    does nothing), attribute value-length limits (only where none is set), and the SDK's own
    span-count metrics for stage spans (the turn's are kept)."""

    __slots__ = (
        "_attributes_type", "_event", "_events_type", "_span_type", "ids", "info", "limits", "max_attributes", "processor",
        "processors", "sampler", "scope", "static", "tracer", "uniform",
    )

    def __init__(
        self, tracer: Any, limits: Any, types: tuple[Any, Any, Any, Any], uniform: bool, static: Any = None,
    ) -> None:
        self.tracer = tracer
        self.sampler = tracer.sampler
        self.ids = tracer.id_generator
        self.processor = tracer.span_processor
        #: The SDK's batch and simple processors themselves (checked in _finished_for): a finished
        #: span goes to each as the multi-processor would hand it on.
        self.processors: tuple[Any, ...] = self.processor._span_processors
        self.info = tracer.instrumentation_info
        self.scope = tracer._instrumentation_scope  # checked in _finished_for
        self.limits = limits
        self.max_attributes: int | None = limits.max_span_attributes
        self._span_type, self._event, self._attributes_type, self._events_type = types
        #: The sampler decides a sampled local span's children on the trace id alone (asked
        #: once per turn); the turn's own span is made finished only then (another sampler
        #: may look at the parent span it is given, which must then be the SDK's).
        self.uniform = uniform
        #: The decision of a static sampler deciding those children (``ALWAYS_ON`` under the
        #: SDK's default ``ParentBased``): it is its answer for every child, with the parent's
        #: trace state, so the turn's stages need not ask it.
        self.static = static

    def open(
        self, context: Any, attributes: Mapping[str, AttributeValue]
    ) -> tuple[Any, _Opened | None, Callable[[], None] | None] | None:
        """The turn's span as ``start_span("responses.turn", context, SERVER, attributes)``
        would start it: a span that carries its span context, what the span made when the turn
        ends needs of its start (``None`` when the sampler does not sample it), and the end of
        the SDK's span-count metric (``None`` where the SDK has none); ``None`` where the tracer
        is disabled (the SDK's tracer configurator), left to ``start_span``."""
        tracer = self.tracer
        enabled = getattr(tracer, "_is_enabled", None)
        if enabled is not None and not enabled():
            return None
        parent: Any = trace.get_current_span(context).get_span_context()
        if not isinstance(parent, trace.SpanContext):
            return None  # start_span's TypeError
        if parent.is_valid:
            trace_id = parent.trace_id
        else:
            parent, trace_id = None, self.ids.generate_trace_id()
        result = self.sampler.should_sample(context, trace_id, _TURN, SpanKind.SERVER, attributes, ())
        decision = result.decision
        flags = _SAMPLED if decision.is_sampled() else 0
        if _RANDOM_TRACE_ID and (
            parent.trace_flags.random_trace_id if parent is not None else getattr(self.ids, "is_trace_id_random", _no)()
        ):
            flags |= _RANDOM_TRACE_ID
        span_context = trace.SpanContext(
            trace_id, self.ids.generate_span_id(), is_remote=False, trace_flags=trace.TraceFlags(flags),
            trace_state=result.trace_state,
        )
        metrics = getattr(tracer, "_tracer_metrics", None)
        on_end = metrics.start_span(parent, decision) if metrics is not None else None
        span = trace.NonRecordingSpan(span_context)
        if not flags & _SAMPLED:
            # Recorded or not, a span the sampler does not sample reaches none of the accepted
            # processors: the turn records nothing, as an unsampled one does.
            return span, None, on_end
        return span, (parent, tracer.resource, time_ns(), dict(result.attributes)), on_end

    def child(
        self, turn: _Turn, name: str, kind: SpanKind, attributes: Mapping[str, AttributeValue] | None
    ) -> tuple[Any, Mapping[str, Any] | None] | Literal["dropped", "start_span"]:
        """The span context (and the sampler's attributes) ``start_span`` would give a child of
        ``turn``'s span named ``name``; ``"dropped"`` when the sampler does not sample it,
        ``"start_span"`` when its attributes are over the limit.

        A sampler that decides a child of a sampled local span on its trace id alone, and passes
        its attributes through (the SDK's static and ratio samplers, and ``ParentBased`` with one
        of them for that case, the SDK's default), is asked once per turn: its answer for the
        first stage is its answer for every other."""
        parent = turn._span.get_span_context()
        known = turn._children
        if known is None and self.static is not None:
            known = turn._children = (self.static.is_sampled(), parent.trace_state)
        if known is not None:
            sampled, trace_state = known
            kept = attributes
        else:
            result = self.sampler.should_sample(turn._parent_context(), parent.trace_id, name, kind, attributes, ())
            sampled, trace_state, kept = result.decision.is_sampled(), result.trace_state, result.attributes
            if self.uniform:
                turn._children = (sampled, trace_state)
        span_id = self.ids.generate_span_id()  # drawn whatever the decision, as start_span does
        if not sampled:
            # The accepted processors export sampled spans only: a span the sampler does not
            # sample would reach nothing.
            return "dropped"
        if self.max_attributes is not None and kept is not None and len(kept) > self.max_attributes:
            return "start_span"
        context = trace.SpanContext(
            parent.trace_id, span_id, is_remote=False, trace_flags=parent.trace_flags, trace_state=trace_state
        )
        return context, kept

    def event(self, attributes: dict[str, str], timestamp: int) -> Any:
        """An ``exception`` event as ``Span.add_event`` makes it (its attributes bounded only
        where a limit cuts them)."""
        limit = self.limits.max_event_attributes
        if limit is not None and len(attributes) > limit:
            return self._event("exception", self._attributes_type(limit, attributes, immutable=True), timestamp)
        return self._event("exception", attributes, timestamp)

    def emit(
        self, parent: Any, resource: Any, name: str, kind: SpanKind, context: Any, attributes: Mapping[str, Any] | None,
        start_ns: int, end_ns: int, error: BaseException | None, events: tuple[Any, ...] = (),
        status: Status | None = None,
    ) -> None:
        """Hand the finished span to the processors."""
        if error is not None:
            events = (*events, self.event(_exception_attributes(error), end_ns))
            status = Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
        limit = self.limits.max_events
        if limit is not None and len(events) > limit:
            bounded = self._events_type(limit)
            bounded.extend(events)
            events = bounded
        span = self._span_type(
            name, context=context, parent=parent, resource=resource, attributes=attributes, events=events, kind=kind,
            instrumentation_info=self.info, status=status or _UNSET, start_time=start_ns, end_time=end_ns,
            instrumentation_scope=self.scope,
        )
        for processor in self.processors:
            processor.on_end(span)


_TURN = "responses.turn"
_SAMPLED: int = trace.TraceFlags.SAMPLED
#: W3C trace context level 2's random-trace-id flag, where the SDK sets it (newer SDKs).
_RANDOM_TRACE_ID: int = getattr(trace.TraceFlags, "RANDOM_TRACE_ID", 0)


def _no() -> bool:
    return False


_UNSET = Status(StatusCode.UNSET)


def _exception_attributes(error: BaseException) -> dict[str, str]:
    """An ``exception`` event's attributes (OpenTelemetry's semantic conventions), as the SDK's
    ``Span.record_exception`` writes them for an exception that did not escape the span."""
    module, name = type(error).__module__, type(error).__qualname__
    return {
        "exception.type": f"{module}.{name}" if module and module != "builtins" else name,
        "exception.message": str(error),
        "exception.stacktrace": "".join(traceback.format_exception(type(error), error, error.__traceback__)),
        "exception.escaped": "False",
    }


def _finished_for(tracer: Any) -> _Finished | None:
    """A :class:`_Finished` for ``tracer`` when it is the SDK's ``Tracer`` exporting through only
    the SDK's ``BatchSpanProcessor``/``SimpleSpanProcessor``, with no attribute-length limit;
    ``None`` otherwise (any other SDK, processor or limit: every span through ``start_span``).
    Reads private attributes of the SDK (its multi-processor's processor list, the tracer's span
    limits and instrumentation scope, ``ParentBased``'s delegate for a sampled local parent),
    each checked for the type it must have; and, where they are there, the tracer's
    ``_is_enabled`` and ``_tracer_metrics`` (newer SDKs), as ``start_span`` does."""
    try:
        from opentelemetry.attributes import BoundedAttributes
        from opentelemetry.sdk.trace import (
            ConcurrentMultiSpanProcessor,
            Event,
            ReadableSpan,
            SpanLimits,
            SynchronousMultiSpanProcessor,
        )
        from opentelemetry.sdk.trace import Tracer as SdkTracer
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import (
            Decision,
            ParentBased,
            ParentBasedTraceIdRatio,
            StaticSampler,
            TraceIdRatioBased,
        )
        from opentelemetry.sdk.util import BoundedList
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    except ImportError:  # pragma: no cover - the API without the SDK
        return None
    if type(tracer) is not SdkTracer or not hasattr(tracer, "_span_limits"):
        return None
    multi = getattr(tracer, "span_processor", None)
    processors = getattr(multi, "_span_processors", None)
    limits = getattr(tracer, "_span_limits", None)
    if (
        type(multi) not in (SynchronousMultiSpanProcessor, ConcurrentMultiSpanProcessor)
        or not isinstance(processors, tuple)
        or not processors
        or any(type(p) not in (BatchSpanProcessor, SimpleSpanProcessor) for p in processors)
        or not isinstance(limits, SpanLimits)
        or limits.max_span_attribute_length is not None
        or limits.max_attribute_length is not None
        or not isinstance(getattr(tracer, "_instrumentation_scope", None), InstrumentationScope)
        or not all(hasattr(tracer, a) for a in ("sampler", "id_generator", "instrumentation_info", "resource"))
    ):
        return None
    # A sampler that decides a sampled local span's children on the trace id alone, passing
    # their attributes through (reads ParentBased's private delegate for that case).
    decider: Any = tracer.sampler
    if type(decider) in (ParentBased, ParentBasedTraceIdRatio):
        decider = getattr(decider, "_local_parent_sampled", None)
    uniform = type(decider) in (StaticSampler, TraceIdRatioBased)
    static = getattr(decider, "_decision", None) if type(decider) is StaticSampler else None
    if static is not None and not isinstance(static, Decision):
        static = None
    return _Finished(tracer, limits, (ReadableSpan, Event, BoundedAttributes, BoundedList), uniform, static)


def _record(span: Any, error: BaseException, timestamp: int) -> None:
    span.record_exception(error, timestamp=timestamp)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def _kind(name: str) -> SpanKind:
    return SpanKind.CLIENT if name in _CLIENT_STAGES else SpanKind.INTERNAL


class _Turn:
    """A turn's span, started when the turn starts (its trace id and context are needed then),
    and its stages, recorded as it runs and made spans with their own times in one pass when it
    ends, which the pipeline does once the client has the terminal event. Where spans are made
    finished (:class:`_Finished`), all the turn's span needs before the answer is its span
    context and the sampler's word (:meth:`_Finished.open`), and the engine stage's context when
    the engine request takes it (:meth:`inject`); otherwise the SDK starts the turn's span then,
    and the engine stage's. Everything else (the spans, the exporter's queue) comes after. A
    turn the provider does not record (no SDK, or sampled out) records nothing."""

    __slots__ = (
        "_attributes", "_children", "_context", "_ended", "_events", "_finished", "_on_end", "_opened", "_own", "_span",
        "_stages", "_trace_id", "_tracer", "recording",
    )

    def __init__(
        self, tracer: Any, span: Any, own: frozenset[str] | None, finished: _Finished | None,
        opened: _Opened | None = None, on_end: Callable[[], None] | None = None,
    ) -> None:
        self._tracer = tracer
        self._finished = finished
        #: The sampler's word on the turn's stage spans, where one word holds for all (_Finished.child).
        self._children: tuple[bool, Any] | None = None
        self._span = span
        self._own = own
        self._context: Any = None
        self._trace_id: str | None = None
        self._ended = False
        self._stages: list[_Stage] = []
        self._attributes: dict[str, AttributeValue] = {}
        #: A turn span made finished: what ``start_span`` would have kept of its start; its
        #: exception events (failed stages without a span of their own); the SDK's metric's end.
        self._opened = opened
        self._events: list[Any] = []
        self._on_end = on_end
        self.recording: bool = opened is not None or span.is_recording()

    @property
    def trace_id(self) -> str:
        if self._trace_id is None:
            context = self._span.get_span_context()
            self._trace_id = trace.format_trace_id(context.trace_id) if context.is_valid else ""
        return self._trace_id

    def _parent_context(self) -> Any:
        """The context that makes a span a child of the turn's (made once per turn)."""
        if self._context is None:
            self._context = trace.set_span_in_context(self._span)
        return self._context

    def _has_span(self, name: str) -> bool:
        own = self._own
        return own is None or name in own or name.split(" ", 1)[0] in own

    def set(self, key: str, value: AttributeValue) -> None:
        if self.recording:
            self._attributes[key] = value

    def stage(self, name: str) -> StageSpan:
        if not self.recording:
            return NO_STAGE
        stage = _Stage(name)
        self._stages.append(stage)
        return stage

    def inject(self, stage: StageSpan) -> dict[str, str]:
        span = self._span
        if isinstance(stage, _Stage) and self._has_span(stage.name):
            # The request is a child of this stage: its span's context must exist now.
            if stage.span is None and stage.context is None and self._finished is not None:
                decided = self._finished.child(self, stage.name, _kind(stage.name), None)
                if not isinstance(decided, str):  # otherwise: the SDK's span, whatever it decides
                    stage.context = decided
            if stage.context is not None:
                return _carrier(stage.context[0])
            if stage.span is None:
                stage.span = self._tracer.start_span(
                    stage.name, context=self._parent_context(), kind=_kind(stage.name), start_time=stage.start_ns
                )
            span = stage.span
        return _carrier(span.get_span_context())

    def end(self, status: str, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        end_ns = time_ns()
        span = self._span
        if self.recording:
            attributes = self._attributes
            for stage in self._stages:
                self._emit(stage, end_ns)
            attributes["responses_cache.status"] = status
            if self._opened is None:
                span.set_attributes(attributes)
        if self._on_end is not None:
            self._on_end()  # the SDK's span-count metric, as Span.end records it
        if self._opened is not None:
            self._end_finished(status, error, end_ns)
        else:
            if error is not None:
                _record(span, error, end_ns)
            elif status in _FAILED:
                span.set_status(Status(StatusCode.ERROR, status))
            span.end(end_time=end_ns)
        # The turn object outlives its end (in the connection's bookkeeping, in a log line's
        # lookup of the trace id): keep the trace id, let the stages (their errors) go.
        self._trace_id = self.trace_id
        self._stages, self._attributes, self._context, self._events, self._opened = [], {}, None, [], None

    def _end_finished(self, status: str, error: BaseException | None, end_ns: int) -> None:
        """The turn's span made finished, as ``start_span`` and ``end`` would have made it."""
        assert self._opened is not None and self._finished is not None
        parent, resource, start_ns, started = self._opened
        finished = self._finished
        later = self._attributes
        attributes: Mapping[str, Any] = {**started, **later}
        limit = finished.max_attributes
        if limit is not None and len(attributes) > limit:  # the oldest dropped, as the SDK's span does
            bounded = finished._attributes_type(limit, started, immutable=False)
            for key, value in later.items():
                bounded[key] = value
            attributes = bounded
        failed = Status(StatusCode.ERROR, status) if error is None and status in _FAILED else None
        finished.emit(
            parent, resource, _TURN, SpanKind.SERVER, self._span.get_span_context(), attributes, start_ns, end_ns,
            error, tuple(self._events), failed,
        )

    def _emit(self, stage: _Stage, turn_end_ns: int) -> None:
        """The stage as a span with its own times (a stage still open ends with its turn), or,
        for a stage without a span of its own, its duration and failure on the turn span."""
        name, end_ns, error = stage.name, stage.end_ns or turn_end_ns, stage.error
        if not self._has_span(name):
            key = f"responses_cache.stage_ms.{name.replace(' ', '.')}"
            self._attributes[key] = round((end_ns - stage.start_ns) / 1e6, 3)
            if error is not None:
                if self._opened is not None and self._finished is not None:
                    described = {**_exception_attributes(error), "responses_cache.stage": name}
                    self._events.append(self._finished.event(described, end_ns))
                else:
                    self._span.record_exception(error, attributes={"responses_cache.stage": name}, timestamp=end_ns)
            return
        span = stage.span
        finished = self._finished
        if span is None and finished is not None:
            kind = _kind(name)
            parent = self._span.get_span_context()
            resource = self._opened[1] if self._opened is not None else self._span.resource
            if stage.context is not None:
                context, kept = stage.context
                attributes = {**kept, **stage.attributes} if kept and stage.attributes else (stage.attributes or kept)
                finished.emit(parent, resource, name, kind, context, attributes, stage.start_ns, end_ns, error)
                return
            decided = finished.child(self, name, kind, stage.attributes)
            if decided == "dropped":
                return
            if not isinstance(decided, str):
                context, kept = decided
                finished.emit(parent, resource, name, kind, context, kept, stage.start_ns, end_ns, error)
                return
        if span is None:
            span = self._tracer.start_span(
                name, context=self._parent_context(), kind=_kind(name), attributes=stage.attributes,
                start_time=stage.start_ns,
            )
        elif stage.attributes:
            span.set_attributes(stage.attributes)
        if error is not None:
            _record(span, error, end_ns)
        span.end(end_time=end_ns)


#: What a turn span made finished keeps of its start: the parent's span context (``None`` for a
#: root), the resource, the start time, the sampler's attributes.
_Opened = tuple[Any, Any, int, dict[str, Any]]


def _carrier(context: Any) -> dict[str, str]:
    """The W3C headers for ``context``, as ``TraceContextTextMapPropagator.inject`` writes them
    (without the context and span objects it goes through)."""
    if context == _INVALID:
        return {}
    carrier = {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"}
    if context.trace_state:
        carrier["tracestate"] = context.trace_state.to_header()
    return carrier


_INVALID = trace.INVALID_SPAN_CONTEXT


class OpenTelemetryTracer:
    """Turn and stage spans through an OpenTelemetry tracer provider (the global one by default).

    Before the client's answer a turn costs the SDK its span's context (and the engine stage's,
    when its request takes it); every stage is two clock reads then, and the spans are made with
    those times once the client has the terminal event (see :class:`_Turn`). Where the provider
    exports through only the SDK's batch or simple span processors, spans are made finished,
    straight to the processors, a third of the SDK's work of starting and ending them
    (:class:`_Finished`); with any other processor, through ``Tracer.start_span``. A turn that is
    not recorded (no SDK configured, or sampled out) records nothing.

    ``stages``: the stages that get a span of their own (``None``: all of them; ``"hook"`` names
    every hook's). The others are timed on the turn span as ``responses_cache.stage_ms.<stage>``
    attributes (a failure as an exception event naming the stage): a span costs the SDK some
    tens of microseconds to make and export, an attribute next to nothing. ``stages={"engine"}``
    keeps the engine call, whose span the engine's own spans hang under."""

    def __init__(self, tracer_provider: Any = None, *, stages: Collection[str] | None = None) -> None:
        self._tracer = trace.get_tracer("responses_cache", _version(), tracer_provider=tracer_provider)
        self._stages = frozenset(stages) if stages is not None else None
        #: Finished stage spans (:class:`_Finished`), decided again whenever the provider's
        #: processors change (one may be added after this tracer is made).
        self._finished: _Finished | None = None
        self._processors: Any = None

    def start_turn(self, carrier: Mapping[str, str], attributes: Mapping[str, AttributeValue]) -> TurnSpan:
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        processors = getattr(getattr(self._tracer, "span_processor", None), "_span_processors", None)
        if processors is not self._processors:
            self._processors, self._finished = processors, _finished_for(self._tracer)
        finished = self._finished
        if finished is not None and finished.uniform:
            opened = finished.open(parent, attributes)
            if opened is not None:
                span, start, on_end = opened
                return _Turn(self._tracer, span, self._stages, finished if start is not None else None, start, on_end)
        span = self._tracer.start_span(_TURN, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        if finished is not None and not span.get_span_context().trace_flags.sampled:
            finished = None  # recorded, not sampled: its stages through start_span, as the SDK decides
        return _Turn(self._tracer, span, self._stages, finished)


class OpenTelemetryMetrics:
    """Counters (``inc``) and histograms (``observe``) through an OpenTelemetry meter provider,
    created on first use, named ``responses_cache_<name>`` (counters lose ``_total``)."""

    def __init__(self, meter_provider: Any = None, namespace: str = "responses_cache") -> None:
        self._meter = otel_metrics.get_meter("responses_cache", _version(), meter_provider=meter_provider)
        self.namespace = namespace
        self._counters: dict[str, Any] = {}
        self._histograms: dict[str, Any] = {}

    def inc(self, name: str, labels: Labels | None = None, value: float = 1.0) -> None:
        counter = self._counters.get(name)
        if counter is None:
            base = name.removesuffix("_total")
            counter = self._counters[name] = self._meter.create_counter(
                f"{self.namespace}_{base}", description=base.replace("_", " ")
            )
        counter.add(value, labels)

    def observe(self, name: str, value: float, labels: Labels | None = None) -> None:
        histogram = self._histograms.get(name)
        if histogram is None:
            histogram = self._histograms[name] = self._meter.create_histogram(
                f"{self.namespace}_{name}", description=name.replace("_", " ")
            )
        histogram.record(value, labels)


def configure_from_environment() -> bool:
    """For ``serve --otel``: when no tracer provider is configured yet (no
    ``opentelemetry-instrument``, no code of the user's), install SDK providers that export over
    OTLP/HTTP, configured by the standard ``OTEL_EXPORTER_OTLP_*`` and ``OTEL_SERVICE_NAME``
    variables. Returns whether it installed them (``False``: providers were already there)."""
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImportError(
            "serve --otel exports over OTLP: pip install opentelemetry-exporter-otlp-proto-http "
            "(or configure providers yourself, e.g. with opentelemetry-instrument)"
        ) from exc
    import os

    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if named else {"service.name": "responses-cache"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    otel_metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))
    return True
