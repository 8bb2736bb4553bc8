"""``responses_cache.tracing``, the documented import path of :mod:`responses_cache.observability.tracing`.

It re-exports that module's public names (the module moved when the package was grouped by
role). Patch or extend the module itself, not this one."""

from .observability.tracing import (
    NO_STAGE,
    NO_TRACER,
    NO_TURN,
    TRACE_HEADERS,
    AttributeValue,
    NoTracer,
    StageSpan,
    Tracer,
    TurnSpan,
    trace_headers,
    trace_id_of,
)

__all__ = [
    "NO_STAGE",
    "NO_TRACER",
    "NO_TURN",
    "TRACE_HEADERS",
    "AttributeValue",
    "NoTracer",
    "StageSpan",
    "Tracer",
    "TurnSpan",
    "trace_headers",
    "trace_id_of",
]
