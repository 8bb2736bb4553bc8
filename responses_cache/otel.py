"""OpenTelemetry traces and metrics (``pip install 'responses-cache[otel]'``).

:class:`OpenTelemetryTracer` implements the :mod:`responses_cache.tracing` seam: a ``SERVER``
span per turn, continuing the client's W3C trace, with a child span per pipeline stage, and the
engine stage's context injected into the engine request (``traceparent``), so an engine that
traces (vLLM ``--otlp-traces-endpoint``) puts its spans under ours.

:class:`OpenTelemetryMetrics` implements :class:`~responses_cache.metrics.Metrics` with the
same names as :class:`~responses_cache.metrics.PrometheusMetrics` (``responses_cache_<name>``;
counters without ``_total``, which a Prometheus exporter adds back), so a dashboard reads either.

Both use the global providers unless given their own (``tracer_provider=``, ``meter_provider=``);
with only ``opentelemetry-api`` installed and no SDK configured, they record nothing.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from types import TracebackType
from typing import Any

from .metrics import Labels
from .tracing import AttributeValue, StageSpan, TurnSpan

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("responses_cache.otel needs `pip install 'responses-cache[otel]'`") from exc

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
    __slots__ = ("_ended", "_span")

    def __init__(self, span: Any) -> None:
        self._span = span
        self._ended = False

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        if error is not None:
            _record(self._span, error)
        self._span.end()

    def __enter__(self) -> _Stage:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end(exc)


def _record(span: Any, error: BaseException) -> None:
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


class _Timed:
    """A stage without a span of its own: its duration (and failure) go on the turn span."""

    __slots__ = ("_ended", "_name", "_start", "_turn")

    def __init__(self, turn: Any, name: str) -> None:
        self._turn = turn
        self._name = name
        self._start = time.perf_counter()
        self._ended = False

    def set(self, key: str, value: AttributeValue) -> None:
        pass

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        elapsed_ms = (time.perf_counter() - self._start) * 1000
        self._turn.set_attribute(f"responses_cache.stage_ms.{self._name.replace(' ', '.')}", round(elapsed_ms, 3))
        if error is not None:
            self._turn.record_exception(error, attributes={"responses_cache.stage": self._name})

    def __enter__(self) -> _Timed:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end(exc)


class _Turn:
    __slots__ = ("_context", "_ended", "_span", "_stages", "_tracer")

    def __init__(self, tracer: Any, span: Any, stages: frozenset[str] | None) -> None:
        self._tracer = tracer
        self._span = span
        self._stages = stages
        self._context = trace.set_span_in_context(span)
        self._ended = False

    @property
    def recording(self) -> bool:
        return bool(self._span.is_recording())

    @property
    def trace_id(self) -> str:
        context = self._span.get_span_context()
        return trace.format_trace_id(context.trace_id) if context.is_valid else ""

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def stage(self, name: str) -> StageSpan:
        stages = self._stages
        if stages is not None and name not in stages and name.split(" ", 1)[0] not in stages:
            return _Timed(self._span, name)
        kind = SpanKind.CLIENT if name in _CLIENT_STAGES else SpanKind.INTERNAL
        return _Stage(self._tracer.start_span(name, context=self._context, kind=kind))

    def inject(self, stage: StageSpan) -> dict[str, str]:
        span = stage._span if isinstance(stage, _Stage) else self._span
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def end(self, status: str, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self._span.set_attribute("responses_cache.status", status)
        if error is not None:
            _record(self._span, error)
        elif status in _FAILED:
            self._span.set_status(Status(StatusCode.ERROR, status))
        self._span.end()


class OpenTelemetryTracer:
    """Turn and stage spans through an OpenTelemetry tracer provider (the global one by default).

    ``stages``: the stages that get a span of their own (``None``: all of them; ``"hook"`` names
    every hook's). The others are timed on the turn span as ``responses_cache.stage_ms.<stage>``
    attributes (a failure as an exception event naming the stage): a span costs the SDK some
    tens of microseconds to make and export, an attribute next to nothing. ``stages={"engine"}``
    keeps the engine call, whose span the engine's own spans hang under."""

    def __init__(self, tracer_provider: Any = None, *, stages: Collection[str] | None = None) -> None:
        self._tracer = trace.get_tracer("responses_cache", _version(), tracer_provider=tracer_provider)
        self._stages = frozenset(stages) if stages is not None else None

    def start_turn(self, carrier: Mapping[str, str], attributes: Mapping[str, AttributeValue]) -> TurnSpan:
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        span = self._tracer.start_span("responses.turn", context=parent, kind=SpanKind.SERVER, attributes=attributes)
        return _Turn(self._tracer, span, self._stages)


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
