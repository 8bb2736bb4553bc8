"""Traces: the span tree and attributes of a turn, read back from OpenTelemetry's in-memory
exporter, over real sockets (WebSocket and HTTP) against the recording backend.

A turn span (``responses.turn``) continues the client's W3C trace (``traceparent`` on the
upgrade or the request) and has one child per stage; the engine request carries a
``traceparent`` naming the turn's ``engine`` stage, so an engine's spans join the trace.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from backends import RecordingBackend, until
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from wsclient import MODEL, RENDERER, TERMINAL, function_tool, ws_connect

from responses_cache import Biller, JsonlSink, create_app
from responses_cache.observability.otel import OpenTelemetryTracer
from responses_cache.safety import PatternPolicy

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
#: What every generating turn's span has under it (a store: true turn also has ``store``).
ENGINE_STAGES = {"resolve", "validate", "render", "engine", "engine.first_token"}


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(exporter: InMemorySpanExporter) -> OpenTelemetryTracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OpenTelemetryTracer(provider)


def turns(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == "responses.turn"]


def stages(exporter: InMemorySpanExporter, turn: ReadableSpan) -> dict[str, ReadableSpan]:
    assert turn.context is not None
    children = [s for s in exporter.get_finished_spans() if s.parent is not None and s.parent.span_id == turn.context.span_id]
    by_name = {s.name: s for s in children}
    assert len(by_name) == len(children), [s.name for s in children]  # one span per stage
    return by_name


async def finished_turns(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    """The turn spans once ``count`` have ended (their spans end on the server side, independently of what the client reads)."""
    await until(lambda: len(turns(exporter)) >= count, f"{count} turn spans")
    return sorted(turns(exporter), key=lambda s: s.start_time or 0)


def parent_id(headers: dict[str, str]) -> int:
    """The span id a ``traceparent`` names as the parent."""
    return int(headers["traceparent"].split("-")[2], 16)


def trace_of(headers: dict[str, str]) -> str:
    return headers["traceparent"].split("-")[1]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_websocket_tool_loop_continues_the_clients_trace_stage_by_stage(
    serve: Callable[..., Any], backend: RecordingBackend, tracer: OpenTelemetryTracer,
    exporter: InMemorySpanExporter, tmp_path: Path,
) -> None:
    biller = Biller(JsonlSink(tmp_path / "usage.jsonl"), journal_path=tmp_path / "journal")
    server = serve(tracer=tracer, hooks=[PatternPolicy(keywords=["forbidden"])], billing=biller)
    async with ws_connect(server.ws_url, additional_headers={"traceparent": TRACEPARENT}) as ws:
        first = await ws.ok(
            input="go", tools=[function_tool()], metadata={"call": "run", "call_id": "c1", "args": '{"step": 1}'}
        )
        second = await ws.ok(
            previous_response_id=first["id"], tools=[function_tool()],
            input=[{"type": "function_call_output", "call_id": "c1", "output": "done"}],
        )
    one, two = await finished_turns(exporter, 2)
    for span, response, tier in ((one, first, "none"), (two, second, "connection")):
        assert span.kind == SpanKind.SERVER
        assert span.context is not None and span.parent is not None
        # The client's trace, under the client's span.
        assert f"{span.context.trace_id:032x}" == TRACE_ID and f"{span.parent.span_id:016x}" == CLIENT_SPAN
        a = attrs(span)
        assert a["gen_ai.response.id"] == response["id"]
        assert a["gen_ai.request.model"] == MODEL and a["responses_cache.transport"] == "websocket"
        assert a["responses_cache.tenant"] == "default" and a["responses_cache.parent_tier"] == tier
        assert a["responses_cache.status"] == "completed" and span.status.status_code != StatusCode.ERROR
        assert a["gen_ai.usage.input_tokens"] == response["usage"]["input_tokens"]
        by_name = stages(exporter, span)
        assert set(by_name) == ENGINE_STAGES | {"hook patterns", "journal.open", "journal.close", "store"}
        assert by_name["engine"].kind == SpanKind.CLIENT
        # Each stage lies inside its turn, and the first token comes before the engine's end.
        for stage in by_name.values():
            assert span.start_time is not None and span.end_time is not None
            assert stage.start_time is not None and stage.end_time is not None
            assert span.start_time <= stage.start_time <= stage.end_time <= span.end_time
        assert by_name["engine.first_token"].end_time <= by_name["engine"].end_time  # type: ignore[operator]
    # The continuation appended to the token log: what it reused is the first turn's prompt.
    first_rendered = attrs(one)["responses_cache.tokens.rendered"]
    assert attrs(one)["responses_cache.tokens.reused"] == 0 and first_rendered > 0
    assert attrs(two)["responses_cache.tokens.reused"] >= first_rendered
    assert attrs(two)["responses_cache.render.incremental"] is True
    # Each engine request continued the trace under its turn's engine stage.
    for call, span in zip(backend.calls, (one, two), strict=True):
        headers = dict(call.request.trace_context)
        assert trace_of(headers) == TRACE_ID
        assert parent_id(headers) == stages(exporter, span)["engine"].context.span_id  # type: ignore[union-attr]


async def test_http_turn_starts_or_continues_a_trace(
    serve: Callable[..., Any], backend: RecordingBackend, tracer: OpenTelemetryTracer, exporter: InMemorySpanExporter
) -> None:
    server = serve(tracer=tracer)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=15) as client:
        continued = await client.post(
            "/responses", json={"model": MODEL, "input": "hi", "store": False}, headers={"traceparent": TRACEPARENT}
        )
        fresh = await client.post("/responses", json={"model": MODEL, "input": "hi", "store": False})
    assert continued.status_code == fresh.status_code == 200
    one, two = await finished_turns(exporter, 2)
    assert attrs(one)["responses_cache.transport"] == "http" and attrs(one)["gen_ai.response.id"] == continued.json()["id"]
    assert one.parent is not None and f"{one.parent.span_id:016x}" == CLIENT_SPAN
    assert two.parent is None and f"{two.context.trace_id:032x}" != TRACE_ID  # type: ignore[union-attr]
    assert set(stages(exporter, one)) == ENGINE_STAGES  # store: false, no billing, no hooks
    # Each engine request is in its own turn's trace.
    assert [trace_of(dict(c.request.trace_context)) for c in backend.calls] == [
        f"{s.context.trace_id:032x}" for s in (one, two)  # type: ignore[union-attr]
    ]


async def test_a_hydrated_turn_says_which_tier_served_it(
    serve: Callable[..., Any], tracer: OpenTelemetryTracer, exporter: InMemorySpanExporter
) -> None:
    server = serve(tracer=tracer, hot_cache_bytes=0)  # no hot cache: continuations come from the store
    async with httpx.AsyncClient(base_url=server.http_url, timeout=15) as client:
        first = (await client.post("/responses", json={"model": MODEL, "input": "hi"})).json()
        second = await client.post(
            "/responses", json={"model": MODEL, "input": "more", "previous_response_id": first["id"]}
        )
    assert second.status_code == 200
    _, hydrated = await finished_turns(exporter, 2)
    a = attrs(hydrated)
    # The memory store keeps no token-log snapshot: the whole conversation is rendered again.
    assert a["responses_cache.parent_tier"] == "store"
    assert a["responses_cache.render.incremental"] is False and a["responses_cache.tokens.reused"] == 0
    assert stages(exporter, hydrated)["resolve"].attributes == {"responses_cache.parent_tier": "store"}


async def test_a_failed_engine_marks_the_engine_stage_and_the_turn(
    serve: Callable[..., Any], tracer: OpenTelemetryTracer, exporter: InMemorySpanExporter
) -> None:
    server = serve(tracer=tracer)
    async with ws_connect(server.ws_url) as ws:
        events = await ws.turn(input="hi", metadata={"text": "a b c", "fail_after": "1"})
    assert events[-1]["type"] == "response.failed"
    (span,) = await finished_turns(exporter, 1)
    assert attrs(span)["responses_cache.status"] == "failed" and span.status.status_code == StatusCode.ERROR
    by_name = stages(exporter, span)
    engine = by_name["engine"]
    assert engine.status.status_code == StatusCode.ERROR and "The engine fell over." in (engine.status.description or "")
    assert [e.name for e in engine.events] == ["exception"]
    # The stages before it went well; the first token had arrived.
    assert all(by_name[s].status.status_code != StatusCode.ERROR for s in ("resolve", "validate", "render", "engine.first_token"))


async def test_a_cancelled_turn_ends_its_spans(
    serve: Callable[..., Any], backend: RecordingBackend, tracer: OpenTelemetryTracer, exporter: InMemorySpanExporter
) -> None:
    server = serve(tracer=tracer)
    async with ws_connect(server.ws_url) as ws:
        await ws.create(input="hi", metadata={"gate": "never"})
        await until(lambda: backend.gates.waiting("never"), "the engine to stream")
    # The client left mid-stream: the turn is cancelled, and its spans still end.
    (span,) = await finished_turns(exporter, 1)
    assert attrs(span)["responses_cache.status"] == "cancelled"
    by_name = stages(exporter, span)
    assert set(by_name) == ENGINE_STAGES
    assert by_name["engine"].end_time is not None and by_name["engine"].end_time <= span.end_time  # type: ignore[operator]
    assert [e.name for e in by_name["engine"].events] == ["exception"]  # the cancellation, on the engine
    assert backend.calls[0].outcome in ("cancelled", "closed")


async def test_a_refused_turn_is_traced_up_to_the_refusal(
    serve: Callable[..., Any], tracer: OpenTelemetryTracer, exporter: InMemorySpanExporter
) -> None:
    server = serve(tracer=tracer)
    async with ws_connect(server.ws_url) as ws:
        error = await ws.error(input="hi", previous_response_id="resp_unknown")
    assert error["error"]["code"] == "previous_response_not_found"
    (span,) = await finished_turns(exporter, 1)
    assert attrs(span)["responses_cache.status"] == "rejected" and span.status.status_code == StatusCode.ERROR
    assert set(stages(exporter, span)) == {"resolve"}


async def test_without_a_tracer_the_clients_trace_context_reaches_the_engine(
    serve: Callable[..., Any], backend: RecordingBackend
) -> None:
    server = serve()
    async with ws_connect(server.ws_url, additional_headers={"traceparent": TRACEPARENT, "tracestate": "k=v"}) as ws:
        await ws.ok(input="hi")
        await ws.ok(input="again")
    assert [dict(c.request.trace_context) for c in backend.calls] == [{"traceparent": TRACEPARENT, "tracestate": "k=v"}] * 2


def _names(spans: Sequence[ReadableSpan]) -> list[str]:
    return sorted(s.name for s in spans)


async def test_concurrent_turns_on_lanes_keep_their_own_spans(
    serve: Callable[..., Any], backend: RecordingBackend, tracer: OpenTelemetryTracer, exporter: InMemorySpanExporter
) -> None:
    server = serve(tracer=tracer)
    async with ws_connect(server.ws_url) as ws:
        await ws.create(input="a", stream_id="a", metadata={"gate": "a"})
        await ws.create(input="b", stream_id="b", metadata={"gate": "b"})
        await until(lambda: backend.gates.waiting("a") and backend.gates.waiting("b"), "both engines")
        backend.gates.release("b", "a")
        await finished_turns(exporter, 2)
        # Read both answers before closing: a client that leaves a full queue unread cannot see
        # the server's close frame, and its close waits out the close timeout.
        ended: list[str] = []

        def both_ended(event: dict[str, Any]) -> bool:
            if event["type"] in TERMINAL:
                ended.append(event["stream_id"])
            return len(ended) == 2

        await ws.recv_until(both_ended)
        assert sorted(ended) == ["a", "b"]
    for span in turns(exporter):
        assert _names(list(stages(exporter, span).values())) == sorted(ENGINE_STAGES | {"store"})


async def test_stages_without_their_own_span_are_timed_on_the_turn(
    serve: Callable[..., Any], backend: RecordingBackend, exporter: InMemorySpanExporter
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server = serve(tracer=OpenTelemetryTracer(provider, stages={"engine"}))
    async with ws_connect(server.ws_url, additional_headers={"traceparent": TRACEPARENT}) as ws:
        await ws.ok(input="hi", store=False)
        refused = await ws.error(input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}])
    assert refused["error"]["param"] is not None
    ok, failed = await finished_turns(exporter, 2)
    # Only the engine call has a span (the engine's trace context names it); the rest are timed.
    assert set(stages(exporter, ok)) == {"engine"}
    assert parent_id(dict(backend.calls[0].request.trace_context)) == stages(exporter, ok)["engine"].context.span_id  # type: ignore[union-attr]
    timed = {k.removeprefix("responses_cache.stage_ms.") for k in attrs(ok) if k.startswith("responses_cache.stage_ms.")}
    assert timed == {"resolve", "validate", "render", "engine.first_token"}
    # A timed stage that fails leaves its exception on the turn, naming the stage.
    assert set(stages(exporter, failed)) == set()
    by_stage = [(e.attributes or {}).get("responses_cache.stage") for e in failed.events if e.name == "exception"]
    assert by_stage == ["validate", None]  # then the turn's own


class SpanLog(SpanProcessor):
    """Appends ``("start" | "end", span name)`` to ``log`` as the SDK starts and ends spans."""

    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.log = log

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.log.append(("start", span.name))

    def on_end(self, span: ReadableSpan) -> None:
        self.log.append(("end", span.name))


class SentLog:
    """ASGI middleware: appends ``("sent", event type)`` to ``log`` once the server has written
    an event on a WebSocket."""

    def __init__(self, app: ASGIApp, log: list[tuple[str, str]]) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def logged(message: Message) -> None:
            await send(message)
            if message["type"] == "websocket.send":
                self.log.append(("sent", json.loads(message["text"])["type"]))

        await self.app(scope, receive, logged)


async def test_a_turn_makes_two_spans_before_its_answer_and_the_rest_after(
    responses_cache_server_factory: Callable[..., Any], backend: RecordingBackend,
    exporter: InMemorySpanExporter, tmp_path: Path,
) -> None:
    """On a turn's way to its terminal event the SDK makes only the spans the engine request
    needs (the turn's and the engine stage's, whose context the request carries), however many
    deltas the engine streams; every other stage's span is made after the client has its answer,
    and every span has ended by then too."""
    log: list[tuple[str, str]] = []
    provider = TracerProvider()
    provider.add_span_processor(SpanLog(log))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    biller = Biller(JsonlSink(tmp_path / "usage.jsonl"), journal_path=tmp_path / "journal")
    app = create_app(
        backend=backend, renderer=RENDERER, tracer=OpenTelemetryTracer(provider),
        hooks=[PatternPolicy(keywords=["forbidden"])], billing=biller,
    )
    server = responses_cache_server_factory(SentLog(app, log))
    async with ws_connect(server.ws_url) as ws:
        events = await ws.turn(input="hi", metadata={"text": "one two three four five six seven eight"})
    assert events[-1]["type"] == "response.completed"
    (turn,) = await finished_turns(exporter, 1)
    answered = log.index(("sent", "response.completed"))
    deltas = [e for e in log[:answered] if e == ("sent", "response.output_text.delta")]
    assert len(deltas) >= 8
    before = [e for e in log[:answered] if e[0] != "sent"]
    assert before == [("start", "responses.turn"), ("start", "engine")]
    after = log[answered + 1 :]
    made = {name for kind, name in after if kind == "start"}
    assert made == set(stages(exporter, turn)) - {"engine"}
    assert made >= {"resolve", "validate", "hook patterns", "render", "engine.first_token", "journal.open", "journal.close"}
    # Every span started ends, the turn's last.
    assert sorted(name for kind, name in after if kind == "end") == sorted([*made, "engine", "responses.turn"])
    assert after[-1] == ("end", "responses.turn")
