"""Per-turn counters and timings behind one small interface.

:class:`InMemoryMetrics` keeps totals for tests and the ``bench`` command;
:class:`PrometheusMetrics` exports them with ``prometheus_client`` (``responses-cache[prometheus]``);
:class:`~responses_cache.observability.otel.OpenTelemetryMetrics` with OpenTelemetry (``responses-cache[otel]``),
under the same names; :class:`MetricsTee` sends them to several at once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Protocol

Labels = Mapping[str, str]


class Metrics(Protocol):
    def inc(self, name: str, labels: Labels | None = None, value: float = 1.0) -> None: ...

    def observe(self, name: str, value: float, labels: Labels | None = None) -> None: ...


class NullMetrics:
    def inc(self, name: str, labels: Labels | None = None, value: float = 1.0) -> None:
        pass

    def observe(self, name: str, value: float, labels: Labels | None = None) -> None:
        pass


def _key(name: str, labels: Labels | None) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted((labels or {}).items()))


class InMemoryMetrics:
    """Counters and (count, sum) summaries, keyed by name and labels."""

    def __init__(self) -> None:
        self.counters: defaultdict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
        self.summaries: defaultdict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = defaultdict(
            lambda: [0.0, 0.0]
        )

    def inc(self, name: str, labels: Labels | None = None, value: float = 1.0) -> None:
        self.counters[_key(name, labels)] += value

    def observe(self, name: str, value: float, labels: Labels | None = None) -> None:
        entry = self.summaries[_key(name, labels)]
        entry[0] += 1
        entry[1] += value

    def total(self, name: str, **labels: str) -> float:
        """Sum of a counter over every label set that includes ``labels``."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.counters.items() if n == name and want <= set(ls))


class MetricsTee:
    """Every count and observation to each of ``targets`` (Prometheus and OpenTelemetry, say)."""

    def __init__(self, *targets: Metrics) -> None:
        self.targets = targets

    def inc(self, name: str, labels: Labels | None = None, value: float = 1.0) -> None:
        for target in self.targets:
            target.inc(name, labels, value)

    def observe(self, name: str, value: float, labels: Labels | None = None) -> None:
        for target in self.targets:
            target.observe(name, value, labels)


#: Histogram buckets for observations named ``*_seconds`` and ``*_tokens``; other names are
#: summaries (count and sum).
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKENS_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)


class PrometheusMetrics:
    """Exports through ``prometheus_client`` (counters, histograms and summaries created on first
    use). Observations named ``*_seconds`` or ``*_tokens`` are histograms (so dashboards can show
    quantiles), any other a summary."""

    def __init__(self, registry: Any = None, namespace: str = "responses_cache") -> None:
        try:
            import prometheus_client
        except ImportError as exc:  # pragma: no cover - depends on the extra
            raise ImportError("PrometheusMetrics needs `pip install responses-cache[prometheus]`") from exc
        self._pc = prometheus_client
        self.registry = registry or prometheus_client.CollectorRegistry()
        self.namespace = namespace
        self._metrics: dict[str, Any] = {}

    def _get(self, kind: str, name: str, labels: Labels | None) -> Any:
        metric = self._metrics.get(name)
        if metric is None:
            options: dict[str, Any] = {}
            cls: Any
            if kind == "counter":
                cls = self._pc.Counter
            elif name.endswith(("_seconds", "_tokens")):
                cls = self._pc.Histogram
                options["buckets"] = SECONDS_BUCKETS if name.endswith("_seconds") else TOKENS_BUCKETS
            else:
                cls = self._pc.Summary
            metric = cls(
                name, name.replace("_", " "), sorted(labels or {}), namespace=self.namespace, registry=self.registry, **options
            )
            self._metrics[name] = metric
        return metric.labels(**labels) if labels else metric

    def inc(self, name: str, labels: Labels | None = None, value: float = 1.0) -> None:
        self._get("counter", name.removesuffix("_total"), labels).inc(value)

    def observe(self, name: str, value: float, labels: Labels | None = None) -> None:
        self._get("summary", name, labels).observe(value)

    @property
    def content_type(self) -> str:
        return str(self._pc.CONTENT_TYPE_LATEST)

    def exposition(self) -> bytes:
        """The text exposition format, for a ``/metrics`` endpoint."""
        data: bytes = self._pc.generate_latest(self.registry)
        return data
