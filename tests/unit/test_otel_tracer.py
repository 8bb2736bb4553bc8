"""The OpenTelemetry tracer on its own: what it makes of a turn, and when.

Before a turn ends the SDK makes two spans: the turn's own when it starts, the engine stage's
when the engine request takes its trace context; every other stage's span is made when the turn
ends, with the times the stage ran. The SDK's in-memory exporter reads them back; a span processor that logs starts
counts the SDK's work.
"""

from __future__ import annotations

import time
import weakref

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind

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
