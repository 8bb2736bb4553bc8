"""The OpenTelemetry tracer on its own: what it makes of a turn, and when.

With a processor of the user's behind the provider (every span through ``start_span``), before a
turn ends the SDK makes two spans: the turn's own when it starts, the engine stage's when the
engine request takes its trace context; every other stage's span is made when the turn ends,
with the times the stage ran (with only the SDK's own processors, spans are made finished: below). The SDK's in-memory exporter reads them back; a span processor that logs starts
counts the SDK's work.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

from responses_cache.observability.otel import OpenTelemetryTracer, _carrier

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Starts(SpanProcessor):
    """The names of the spans the SDK has started, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.names.append(span.name)


def traced(**options: object) -> tuple[OpenTelemetryTracer, InMemorySpanExporter, Starts]:
    exporter, starts = InMemorySpanExporter(), Starts()
    provider = TracerProvider(**options)  # type: ignore[arg-type]
    provider.add_span_processor(starts)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OpenTelemetryTracer(provider), exporter, starts


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_stage_spans_are_made_when_the_turn_ends_but_the_engines_when_its_request_needs_it() -> None:
    tracer, exporter, starts = traced()
    turn = tracer.start_turn({"traceparent": TRACEPARENT}, {"responses_cache.tenant": "t"})
    with turn.stage("resolve") as stage:
        stage.set("responses_cache.parent_tier", "connection")
    with turn.stage("validate"):
        pass
    engine = turn.stage("engine")
    first_token = turn.stage("engine.first_token")
    assert starts.names == ["responses.turn"]  # stages so far are two clock reads each
    headers = turn.inject(engine)
    # The request names the engine stage: its span exists now.
    assert starts.names == ["responses.turn", "engine"]
    assert headers["traceparent"].split("-")[1] == TRACE_ID
    first_token.end()
    engine.end()
    with turn.stage("journal.close"):
        pass
    assert starts.names == ["responses.turn", "engine"]
    turn.end("completed")
    assert starts.names == ["responses.turn", "engine", "resolve", "validate", "engine.first_token", "journal.close"]
    spans = by_name(exporter)
    assert spans["engine"].context is not None
    assert int(headers["traceparent"].split("-")[2], 16) == spans["engine"].context.span_id
    assert spans["engine"].kind == SpanKind.CLIENT
    assert dict(spans["resolve"].attributes or {}) == {"responses_cache.parent_tier": "connection"}
    turn_span = spans["responses.turn"]
    assert turn_span.context is not None and turn_span.parent is not None
    assert f"{turn_span.context.trace_id:032x}" == TRACE_ID
    assert all(s.parent is not None and s.parent.span_id == turn_span.context.span_id for s in spans.values() if s is not turn_span)


def test_a_stage_span_keeps_the_times_the_stage_ran() -> None:
    tracer, exporter, _ = traced()
    turn = tracer.start_turn({}, {})
    began = time.time_ns()
    with turn.stage("validate"):
        pass
    validated = time.time_ns()
    with turn.stage("render"):
        pass
    turn.end("completed")
    spans = by_name(exporter)
    validate, render, whole = spans["validate"], spans["render"], spans["responses.turn"]
    assert whole.start_time is not None and whole.end_time is not None
    assert validate.start_time is not None and validate.end_time is not None and render.start_time is not None
    # Made at the turn's end, timed when they ran.
    assert whole.start_time <= began <= validate.start_time <= validate.end_time <= validated <= render.start_time
    assert whole.end_time > validated


def test_a_stage_left_open_ends_with_its_turn() -> None:
    tracer, exporter, _ = traced()
    turn = tracer.start_turn({}, {})
    turn.stage("store")  # never ended: the turn was cancelled while it ran, say
    turn.end("cancelled", RuntimeError("gone"))
    spans = by_name(exporter)
    assert spans["store"].end_time == spans["responses.turn"].end_time
    assert [e.name for e in spans["responses.turn"].events] == ["exception"]


def test_a_failed_stage_keeps_its_error() -> None:
    tracer, exporter, _ = traced()
    turn = tracer.start_turn({}, {})
    try:
        with turn.stage("hook patterns"):
            raise ValueError("bad input")
    except ValueError as exc:
        turn.end("rejected", exc)
    spans = by_name(exporter)
    hook = spans["hook patterns"]
    assert hook.status.description == "ValueError: bad input"
    assert [e.name for e in hook.events] == ["exception"]
    assert hook.end_time is not None and hook.end_time <= spans["responses.turn"].end_time  # type: ignore[operator]


def test_an_unsampled_turn_records_nothing_and_still_passes_its_trace_on() -> None:
    tracer, exporter, starts = traced(sampler=ALWAYS_OFF)
    turn = tracer.start_turn({"traceparent": TRACEPARENT}, {})
    engine = turn.stage("engine")
    headers = turn.inject(engine)
    assert not turn.recording
    # The engine hears the trace, not sampled: its own spans are not recorded either.
    assert headers["traceparent"].startswith(f"00-{TRACE_ID}-") and headers["traceparent"].endswith("-00")
    with turn.stage("journal.close"):
        pass
    turn.end("completed")
    assert exporter.get_finished_spans() == () and starts.names == []


class StageFailed(Exception):
    pass


def test_an_ended_turn_lets_go_of_its_stages() -> None:
    """A turn's span object may outlive the turn (a log line asks it for the trace id): what its
    stages held (an error, and through it whatever it references) goes when it ends."""
    tracer, exporter, _ = traced()
    turn = tracer.start_turn({}, {})
    error = StageFailed("bad input")
    held = weakref.ref(error)
    turn.stage("validate").end(error)
    turn.end("rejected")
    del error
    assert held() is None
    assert len(turn.trace_id) == 32
    assert [s.name for s in exporter.get_finished_spans()] == ["validate", "responses.turn"]


# -- spans made finished ------------------------------------------------------------------------
#
# With only the SDK's batch or simple processors behind the provider, every stage becomes a
# finished span handed straight to the processors (no ``start_span``; the engine's context is
# decided when its request needs it), and so does the turn's own under the SDK's own samplers
# (its context decided when it starts); with any other processor every span goes through
# ``start_span``. Both must export the same spans, field by field.


class NoOp(SpanProcessor):
    """A processor that does nothing: its presence sends every span through ``start_span``."""


class Picky(Sampler):
    """Samples every span but ``validate`` and tags the ones it samples, as a sampler may."""

    def should_sample(
        self, parent_context: Context | None, trace_id: int, name: str, kind: SpanKind | None = None,
        attributes: Attributes = None, links: Sequence[Link] | None = None, trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if name == "validate":
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {**(attributes or {}), "sampled.by": "picky"})

    def get_description(self) -> str:
        return "Picky"


def counted(tracer: OpenTelemetryTracer) -> list[str]:
    """The names ``tracer``'s SDK tracer is asked to start spans for, from now on."""
    sdk = tracer._tracer  # the SDK's Tracer this tracer made
    names: list[str] = []
    start_span = sdk.start_span

    def counting(name: str, *args: Any, **kwargs: Any) -> Any:
        names.append(name)
        return start_span(name, *args, **kwargs)

    sdk.start_span = counting  # type: ignore[method-assign]
    return names


def failure(message: str) -> ValueError:
    try:
        raise ValueError(message)
    except ValueError as exc:
        return exc


def a_turn(
    tracer: OpenTelemetryTracer, failing_render: bool = False, failing_engine: bool = False, *,
    carrier: dict[str, str] | None = None, status: str = "completed", error: BaseException | None = None,
) -> str:
    """A turn's stages as the pipeline opens them; the ``traceparent`` its engine request got."""
    carrier = {"traceparent": TRACEPARENT, "tracestate": "vendor=1"} if carrier is None else carrier
    turn = tracer.start_turn(carrier, {"responses_cache.tenant": "t"})
    with turn.stage("resolve") as stage:
        stage.set("responses_cache.parent_tier", "connection")
    with turn.stage("validate"):
        pass
    stage = turn.stage("render")
    stage.set("responses_cache.render.incremental", True)
    stage.end(failure("no renderer") if failing_render else None)
    engine = turn.stage("engine")
    first_token = turn.stage("engine.first_token")
    traceparent = turn.inject(engine).get("traceparent", "")
    first_token.end()
    engine.end(failure("engine gone") if failing_engine else None)
    turn.stage("journal.close")  # left open: ends with the turn
    turn.set("responses_cache.parent_tier", "connection")
    turn.set("gen_ai.usage.output_tokens", 40)
    turn.end(status, error)
    return traceparent


class Sequential(RandomIdGenerator):
    """Ids in sequence (trace ids still flagged random, as the SDK's generator's are): the two
    ways of making spans must draw the same ids in the same order."""

    def __init__(self) -> None:
        self.drawn = 0

    def generate_span_id(self) -> int:
        self.drawn += 1
        return self.drawn

    def generate_trace_id(self) -> int:
        self.drawn += 1
        return 0x5EED << 64 | self.drawn


def exported(
    sampler: Sampler | None, slow: bool, failing_render: bool = False, failing_engine: bool = False, *,
    stages: set[str] | None = None, limits: SpanLimits | None = None, **turn: Any,
) -> tuple[list[str], list[tuple[Any, ...]]]:
    exporter = InMemorySpanExporter()
    options: dict[str, Any] = {"id_generator": Sequential(), "span_limits": limits}
    provider = TracerProvider(sampler=sampler, **options) if sampler is not None else TracerProvider(**options)
    if slow:
        provider.add_span_processor(NoOp())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = OpenTelemetryTracer(provider, stages=stages)
    started = counted(tracer)
    traceparent = a_turn(tracer, failing_render, failing_engine, **turn)
    spans = exporter.get_finished_spans()
    ids = {s.context.span_id: s.name for s in spans if s.context is not None}
    if "engine" in ids.values():  # the engine request names the engine's span
        assert ids[int(traceparent.split("-")[2], 16)] == "engine"
    elif traceparent:  # a span not sampled, as the flags say
        assert int(traceparent.split("-")[3], 16) & 1 == 0
    described = []
    for s in sorted(spans, key=lambda s: s.name):
        assert s.context is not None
        attributes = {k: "timed" if ".stage_ms." in k else v for k, v in (s.attributes or {}).items()}
        described.append((
            s.name, s.kind, s.context, s.parent, dict(s.attributes or {}) if not stages else attributes,
            s.status.status_code, s.status.description,
            [(e.name, dict(e.attributes or {}), e.timestamp == s.end_time) for e in s.events], s.resource,
            s.instrumentation_scope, s.end_time is not None and s.start_time is not None and s.end_time >= s.start_time,
            s.dropped_attributes, s.dropped_events, s.dropped_links, list(s.links),
        ))
    return started, described


STAGES = ["resolve", "validate", "render", "engine", "engine.first_token", "journal.close"]


@pytest.mark.parametrize(
    ("sampler", "stages"),
    [
        (None, STAGES),
        (Picky(), [s for s in STAGES if s != "validate"]),
        (ParentBased(ALWAYS_ON, local_parent_sampled=ALWAYS_OFF), []),
    ],
    ids=["default sampler", "a sampler that drops and tags", "a parent-based sampler that drops children"],
)
def test_stage_spans_made_finished_are_the_spans_start_span_makes(sampler: Sampler | None, stages: list[str]) -> None:
    fast_started, fast = exported(sampler, slow=False)
    slow_started, slow = exported(sampler, slow=True)
    # Under the SDK's own samplers (parent based, the default) no span goes through start_span
    # (but the engine's, when the request's context is one the sampler does not sample: the
    # SDK's then); under a sampler of the user's, the turn's does (it is the parent the sampler
    # sees for the stages) and the stages' are made finished.
    assert fast_started == {"default sampler": [], "picky": ["responses.turn"], "drops": ["engine"]}[
        "default sampler" if sampler is None else "picky" if isinstance(sampler, Picky) else "drops"
    ]
    assert slow_started == ["responses.turn", "engine", "resolve", "validate", "render", "engine.first_token", "journal.close"]
    assert fast == slow
    assert sorted(row[0] for row in fast) == sorted(["responses.turn", *stages])


class Tagging(Sampler):
    """Samples (or only records) a turn and tags it, with a trace state of its own, as a sampler may."""

    def __init__(self, decision: Decision = Decision.RECORD_AND_SAMPLE) -> None:
        self.decision = decision

    def should_sample(
        self, parent_context: Context | None, trace_id: int, name: str, kind: SpanKind | None = None,
        attributes: Attributes = None, links: Sequence[Link] | None = None, trace_state: TraceState | None = None,
    ) -> SamplingResult:
        return SamplingResult(self.decision, {**(attributes or {}), "sampled.by": "tagging"}, TraceState([("tag", "1")]))

    def get_description(self) -> str:
        return "Tagging"


def parent_based(root: Sampler) -> Sampler:
    return ParentBased(root, remote_parent_sampled=root)


TURNS: dict[str, dict[str, Any]] = {
    "a root turn": {"carrier": {}},
    "a continued turn": {},
    "a turn the client's trace does not sample": {"carrier": {"traceparent": TRACEPARENT[:-2] + "00"}},
    "a failed turn": {"status": "failed", "error": failure("engine down")},
    "a rejected turn": {"status": "rejected"},
    "failed stages": {"failing_render": True, "failing_engine": True},
    "failed stages without spans of their own": {"failing_render": True, "stages": {"engine"}},
    "a sampler that tags the turn": {"sampler": parent_based(Tagging())},
    "a tagged root turn": {"sampler": parent_based(Tagging()), "carrier": {}},
    "a turn only recorded": {"sampler": parent_based(Tagging(Decision.RECORD_ONLY))},
    "a ratio sampler": {"sampler": ParentBased(TraceIdRatioBased(1.0))},
    "attributes over the limit": {"limits": SpanLimits(max_span_attributes=2)},
    "events over the limit": {
        "limits": SpanLimits(max_events=1, max_event_attributes=2), "failing_render": True, "stages": {"engine"},
        "status": "failed", "error": failure("engine down"),
    },
}


@pytest.mark.parametrize("turn", list(TURNS.values()), ids=list(TURNS))
def test_a_turn_span_made_finished_is_the_span_start_span_makes(turn: dict[str, Any]) -> None:
    """The turn's own span, made finished when the sampler is the SDK's own kind: the same span,
    field by field (ids, flags, trace state, parent, attributes, events, status, limits), as
    ``start_span`` and ``end`` make."""
    options = dict(turn)
    sampler = options.pop("sampler", None)
    fast_started, fast = exported(sampler, slow=False, **options)
    slow_started, slow = exported(sampler, slow=True, **options)
    assert "responses.turn" not in fast_started and slow_started[0] == "responses.turn"
    assert fast == slow
    recorded = not (
        isinstance(sampler, ParentBased) and isinstance(sampler._root, Tagging) and sampler._root.decision is Decision.RECORD_ONLY
    ) and not options.get("carrier", {}).get("traceparent", "-01").endswith("-00")
    assert any(row[0] == "responses.turn" for row in fast) == recorded


def points(reader: InMemoryMetricReader) -> dict[tuple[str, str], float]:
    """The SDK's span metrics' data points."""
    data = reader.get_metrics_data()
    assert data is not None
    return {
        (m.name, str(sorted(p.attributes.items()))): p.value
        for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name.startswith("otel.sdk.span.")
        for p in m.data.data_points  # type: ignore[union-attr]
    }


def test_the_sdks_span_metrics_count_a_turn_span_made_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's own span counts (started, live), where they are enabled, count the turn's span
    as they count one ``start_span`` makes (the stages' made finished are not counted)."""
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")

    def counts(slow: bool) -> dict[tuple[str, str], float]:
        reader = InMemoryMetricReader()
        provider = TracerProvider(meter_provider=MeterProvider(metric_readers=[reader]))
        if slow:
            provider.add_span_processor(NoOp())
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        tracer = OpenTelemetryTracer(provider, stages={"none"})  # the turn's span only
        turn = tracer.start_turn({}, {})
        live = points(reader)
        turn.end("completed")
        return {**{("live " + name, labels): value for (name, labels), value in live.items()}, **points(reader)}

    fast, slow = counts(slow=False), counts(slow=True)
    assert fast == slow
    assert any(name.startswith("live otel.sdk.span.live") and value == 1 for (name, _), value in fast.items())


def test_a_disabled_tracer_makes_no_turn_span() -> None:
    """The SDK's tracer configurator can disable a tracer: ``start_span`` then makes no span,
    and neither does the turn's span made finished."""
    from opentelemetry.sdk.trace import _TracerConfig

    exporter = InMemorySpanExporter()
    provider = TracerProvider(_tracer_configurator=lambda scope: _TracerConfig(is_enabled=False))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    turn = OpenTelemetryTracer(provider).start_turn({"traceparent": TRACEPARENT}, {})
    assert not turn.recording
    turn.end("completed")
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize(
    "context",
    [
        SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0xF067AA0BA902B7, False, TraceFlags(1)),
        SpanContext(1, 2, False, TraceFlags(0), TraceState([("a", "1"), ("b", "2")])),
        SpanContext(0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF, True, TraceFlags(3)),
        INVALID_SPAN_CONTEXT,
    ],
    ids=["sampled", "unsampled with a trace state", "the largest ids, random flag", "invalid"],
)
def test_the_engine_requests_headers_are_the_propagators(context: SpanContext) -> None:
    expected: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(expected, context=set_span_in_context(NonRecordingSpan(context)))
    assert _carrier(context) == expected


@pytest.mark.parametrize(
    ("sampler", "asked"),
    [
        # A parent-based sampler's children of a sampled local span: ALWAYS_ON by default, a
        # static answer (the parent's trace state), not asked at all.
        (ParentBased(TraceIdRatioBased(1.0)), ["responses.turn"]),
        # A ratio sampler for them decides on the trace id: asked once, for the first stage.
        (ParentBased(ALWAYS_ON, local_parent_sampled=TraceIdRatioBased(1.0)), ["responses.turn", "engine"]),
    ],
    ids=["static for children", "ratio for children"],
)
def test_the_sdks_own_samplers_are_asked_once_for_all_of_a_turns_stages(sampler: ParentBased, asked: list[str]) -> None:
    """Parent-based over the SDK's static or ratio samplers decides a child of a sampled span on
    the trace id alone: the stages take the first one's answer (``Picky`` above, a sampler of
    the user's, is asked for each); a static one's answer is known without asking it."""
    names: list[str] = []
    should_sample = sampler.should_sample

    def counting(parent_context: Context | None, trace_id: int, name: str, *args: Any, **kwargs: Any) -> SamplingResult:
        names.append(name)
        return should_sample(parent_context, trace_id, name, *args, **kwargs)

    sampler.should_sample = counting  # type: ignore[method-assign]
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    a_turn(OpenTelemetryTracer(provider))
    assert names == asked  # the turn's, then (a ratio) the first stage to need one
    assert len(exporter.get_finished_spans()) == 7


def test_failed_stages_made_finished_keep_their_errors_as_start_span_records_them() -> None:
    started, spans = exported(None, slow=False, failing_render=True, failing_engine=True)
    assert started == []
    for name, message in (("render", "no renderer"), ("engine", "engine gone")):
        row = next(row for row in spans if row[0] == name)
        assert row[5] == StatusCode.ERROR and row[6] == f"ValueError: {message}"
        [(event, attributes, at_end)] = row[7]
        assert event == "exception" and attributes["exception.message"] == message and at_end
        assert "raise ValueError(message)" in attributes["exception.stacktrace"]
    assert exported(None, slow=True, failing_render=True, failing_engine=True)[1] == spans


def test_a_processor_added_later_sends_the_next_turns_stages_through_start_span() -> None:
    exporter, starts = InMemorySpanExporter(), Starts()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = OpenTelemetryTracer(provider)
    a_turn(tracer)
    assert len(exporter.get_finished_spans()) == 7
    provider.add_span_processor(starts)  # its on_start must see every span from now on
    a_turn(tracer)
    assert starts.names == ["responses.turn", "engine", "resolve", "validate", "render", "engine.first_token", "journal.close"]
    assert len(exporter.get_finished_spans()) == 14


def test_every_processor_gets_the_spans_made_finished() -> None:
    """Spans made finished go to each of the provider's processors, as its multi-processor
    hands a span on."""
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(first))
    provider.add_span_processor(SimpleSpanProcessor(second))
    a_turn(OpenTelemetryTracer(provider))
    assert len(first.get_finished_spans()) == len(second.get_finished_spans()) == 7
