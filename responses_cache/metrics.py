"""Per-turn counters and timings behind one small interface.

:class:`InMemoryMetrics` keeps totals for tests and the ``bench`` command;
:class:`PrometheusMetrics` exports them with ``prometheus_client`` (``responses-cache[prometheus]``).
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


class PrometheusMetrics:
    """Exports through ``prometheus_client`` (counters and summaries created on first use)."""

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
            cls = self._pc.Counter if kind == "counter" else self._pc.Summary
            metric = cls(name, name.replace("_", " "), sorted(labels or {}), namespace=self.namespace, registry=self.registry)
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
