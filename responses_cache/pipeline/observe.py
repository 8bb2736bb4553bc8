"""Observation of a turn: its metrics, its span's closing attributes, its one log record, and
the engine clock (time to first token, and the turn's overhead outside the engine call)."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..observability.metrics import Metrics, NullMetrics
from ..observability.tracing import NO_STAGE, StageSpan, TurnSpan, trace_id_of
from ..protocol.response import Usage
from .render import RenderedPrompt
from .turn import Lineage, Turn

#: One record per finished turn (INFO), for ``serve --log-json``'s one JSON line per turn.
turn_logger = logging.getLogger("responses_cache.turns")


class EngineClock:
    """When a turn's engine call started, streamed its first event, and ended: time to first
    token, and the turn's overhead (its wall time outside the engine call)."""

    __slots__ = ("_metrics", "_span", "_transport", "_turn_started", "ended", "first", "started")

    def __init__(self) -> None:
        self.started: float | None = None
        self.first: float | None = None
        self.ended: float | None = None
        self._span: StageSpan = NO_STAGE
        self._metrics: Metrics = NullMetrics()
        self._transport = ""
        self._turn_started = 0.0

    def start(self, turn: Turn, first_token: StageSpan, metrics: Metrics) -> None:
        self.started = time.perf_counter()
        self._span, self._metrics, self._transport, self._turn_started = first_token, metrics, turn.transport, turn.started

    def first_event(self) -> None:
        """The engine's first event (the first token, or the end of a response with none)."""
        self.first = now = time.perf_counter()
        self._span.end()
        self._metrics.observe("time_to_first_token_seconds", now - self._turn_started, {"transport": self._transport})

    def stop(self) -> None:
        if self.started is not None and self.ended is None:
            self.ended = time.perf_counter()

    def overhead(self, turn: Turn) -> float:
        """The turn's wall time so far, less the engine call's (with ``response.append``, the
        waits for appended input count as the engine's)."""
        total = time.perf_counter() - turn.started
        if self.started is not None and self.ended is not None:
            total -= self.ended - self.started
        return max(total, 0.0)


def observe(metrics: Metrics, turn: Turn, rendered: RenderedPrompt | None, status: str, timings: dict[str, float], clock: EngineClock) -> None:
    """A finished turn's counters and histograms."""
    labels = {"transport": turn.transport}
    metrics.inc(f"responses_{status}_total", labels)
    if not turn.request.generate:
        metrics.inc("warmups_total", labels)
    if rendered is not None:
        metrics.inc("cached_tokens_total", labels, rendered.cached_tokens)
        metrics.inc("render_incremental_total" if rendered.incremental else "render_full_total", labels)
        metrics.observe("rendered_tokens", rendered.log.num_tokens - rendered.cached_tokens, labels)
    for stage, seconds in timings.items():
        metrics.observe("stage_seconds", seconds, {**labels, "stage": stage})
    metrics.observe("turn_overhead_seconds", clock.overhead(turn), labels)


def describe(span: TurnSpan, rendered: RenderedPrompt | None, usage: Usage, engine_cached: int | None) -> None:
    """The turn span's attributes known only at its end: tokens and how they were rendered."""
    if rendered is not None:
        span.set("responses_cache.render.incremental", rendered.incremental)
        span.set("responses_cache.tokens.rendered", rendered.log.num_tokens - rendered.cached_tokens)
        span.set("responses_cache.tokens.reused", rendered.cached_tokens)
    if engine_cached is not None:
        span.set("responses_cache.tokens.engine_cached", engine_cached)
    span.set("gen_ai.usage.input_tokens", usage.input_tokens)
    span.set("gen_ai.usage.output_tokens", usage.output_tokens)


def _in_words(fields: dict[str, Any]) -> str:
    """What a text log line says after ``turn <id> <status>`` (a JSON line carries the fields):
    `` in 41.9 ms (first token 2.1 ms; 512 tokens rendered, 18,044 reused; 40 out)``, and the
    error of a failed turn."""
    details = []
    if "ttft_ms" in fields:
        details.append(f"first token {fields['ttft_ms']:.1f} ms")
    if "rendered_tokens" in fields:
        details.append(f"{fields['rendered_tokens']:,} tokens rendered, {fields['reused_tokens']:,} reused")
    if "output_tokens" in fields:
        details.append(f"{fields['output_tokens']:,} out")
    words = f" in {fields['duration_ms']:.1f} ms"
    if details:
        words += f" ({'; '.join(details)})"
    if "error" in fields:
        words += f": {fields['error']}"
    return words


class TurnLog:
    """A turn's one ``responses_cache.turns`` record (INFO; WARNING when it failed), its fields
    in ``record.turn`` for :class:`~responses_cache.observability.logs.JsonFormatter`."""

    __slots__ = ("_lineage", "_turn")

    def __init__(self, turn: Turn, lineage: Lineage) -> None:
        self._turn = turn
        self._lineage = lineage

    def __call__(
        self,
        status: str,
        rendered: RenderedPrompt | None = None,
        usage: Usage | None = None,
        *,
        clock: EngineClock | None = None,
        engine_cached: int | None = None,
        error: BaseException | None = None,
    ) -> None:
        failed = error is not None or status in ("failed", "error")
        level = logging.WARNING if failed else logging.INFO
        if not turn_logger.isEnabledFor(level):
            return
        turn = self._turn
        fields = self._head(status)
        if clock is not None and clock.first is not None:
            fields["ttft_ms"] = round((clock.first - turn.started) * 1000, 3)
            fields["overhead_ms"] = round(clock.overhead(turn) * 1000, 3)
        if rendered is not None:
            fields["rendered_tokens"] = rendered.log.num_tokens - rendered.cached_tokens
            fields["reused_tokens"] = rendered.cached_tokens
        if usage is not None:
            fields["input_tokens"] = usage.input_tokens
            fields["cached_tokens"] = usage.input_tokens_details.cached_tokens
            fields["output_tokens"] = usage.output_tokens
        if engine_cached is not None:
            fields["engine_cached_tokens"] = engine_cached
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"
            code = getattr(error, "code", None)
            if code:
                fields["error_code"] = code
        turn_logger.log(level, "turn %s %s%s", turn.response_id, status, _in_words(fields), extra={"turn": fields})

    def _head(self, status: str) -> dict[str, Any]:
        turn = self._turn
        return {
            "response_id": turn.response_id,
            "trace_id": self._lineage.span.trace_id or trace_id_of(turn.trace),
            "tenant": turn.tenant,
            "model": turn.request.model,
            "transport": turn.transport,
            "status": status,
            "parent_tier": self._lineage.tier,
            "duration_ms": round((time.perf_counter() - turn.started) * 1000, 3),
        }
