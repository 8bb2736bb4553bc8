"""The OpenTelemetry tracer on its own: what it makes of a turn, and when.

Before a turn ends the SDK makes two spans: the turn's own when it starts, the engine stage's
when the engine request takes its trace context; every other stage's span is made when the turn
ends, with the times the stage ran. The SDK's in-memory exporter reads them back; a span processor that logs starts
counts the SDK's work.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind, StatusCode, TraceState
from opentelemetry.util.types import Attributes

from responses_cache.otel import OpenTelemetryTracer

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


# -- stage spans made finished ------------------------------------------------------------------
#
# With only the SDK's batch or simple processors behind the provider, every stage becomes a
# finished span handed straight to the processors (no ``start_span``; the engine's context is
# decided when its request needs it); with any other processor every span goes through
# ``start_span``. Both must export the same spans.


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


def a_turn(tracer: OpenTelemetryTracer, failing_render: bool = False, failing_engine: bool = False) -> str:
    """A turn's stages as the pipeline opens them; the ``traceparent`` its engine request got."""
    turn = tracer.start_turn({"traceparent": TRACEPARENT, "tracestate": "vendor=1"}, {"responses_cache.tenant": "t"})
    with turn.stage("resolve") as stage:
        stage.set("responses_cache.parent_tier", "connection")
    with turn.stage("validate"):
        pass
    stage = turn.stage("render")
    stage.set("responses_cache.render.incremental", True)
    stage.end(failure("no renderer") if failing_render else None)
    engine = turn.stage("engine")
    first_token = turn.stage("engine.first_token")
    traceparent = turn.inject(engine)["traceparent"]
    first_token.end()
    engine.end(failure("engine gone") if failing_engine else None)
    turn.stage("journal.close")  # left open: ends with the turn
    turn.set("responses_cache.parent_tier", "connection")
    turn.end("completed")
    return traceparent


def exported(
    sampler: Sampler | None, slow: bool, failing_render: bool = False, failing_engine: bool = False
) -> tuple[list[str], list[tuple[Any, ...]]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    if slow:
        provider.add_span_processor(NoOp())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = OpenTelemetryTracer(provider)
    started = counted(tracer)
    traceparent = a_turn(tracer, failing_render, failing_engine)
    spans = exporter.get_finished_spans()
    ids = {s.context.span_id: s.name for s in spans if s.context is not None}
    if "engine" in ids.values():  # the engine request names the engine's span
        assert ids[int(traceparent.split("-")[2], 16)] == "engine"
    else:  # a span not sampled, as the flags say
        assert traceparent.endswith("-00")
    described = []
    for s in sorted(spans, key=lambda s: s.name):
        assert s.context is not None and s.parent is not None
        described.append((
            s.name, s.kind, ids.get(s.parent.span_id, "client"), f"{s.context.trace_id:032x}", int(s.context.trace_flags),
            s.context.trace_state, dict(s.attributes or {}), s.status.status_code, s.status.description,
            [(e.name, dict(e.attributes or {}), e.timestamp == s.end_time) for e in s.events], s.resource,
            s.instrumentation_scope, s.end_time is not None and s.start_time is not None and s.end_time >= s.start_time,
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
    # Only the turn's span goes through start_span; the stages' are made finished (but the
    # engine's, when the request's context is one the sampler does not sample: the SDK's then).
    assert fast_started == (["responses.turn"] if stages else ["responses.turn", "engine"])
    assert slow_started == ["responses.turn", "engine", "resolve", "validate", "render", "engine.first_token", "journal.close"]
    assert fast == slow
    assert sorted(row[0] for row in fast) == sorted(["responses.turn", *stages])


def test_the_sdks_own_samplers_are_asked_once_for_all_of_a_turns_stages() -> None:
    """Parent-based over the SDK's static or ratio samplers decides a child of a sampled span on
    the trace id alone: the stages take the first one's answer (``Picky`` above, a sampler of
    the user's, is asked for each)."""
    asked: list[str] = []
    sampler = ParentBased(TraceIdRatioBased(1.0))
    should_sample = sampler.should_sample

    def counting(parent_context: Context | None, trace_id: int, name: str, *args: Any, **kwargs: Any) -> SamplingResult:
        asked.append(name)
        return should_sample(parent_context, trace_id, name, *args, **kwargs)

    sampler.should_sample = counting  # type: ignore[method-assign]
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    a_turn(OpenTelemetryTracer(provider))
    assert asked == ["responses.turn", "engine"]  # the turn's, then the first stage to need one
    assert len(exporter.get_finished_spans()) == 7


def test_failed_stages_made_finished_keep_their_errors_as_start_span_records_them() -> None:
    started, spans = exported(None, slow=False, failing_render=True, failing_engine=True)
    assert started == ["responses.turn"]
    for name, message in (("render", "no renderer"), ("engine", "engine gone")):
        row = next(row for row in spans if row[0] == name)
        assert row[7] == StatusCode.ERROR and row[8] == f"ValueError: {message}"
        [(event, attributes, at_end)] = row[9]
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
