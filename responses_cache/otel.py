"""``responses_cache.otel``, the documented import path of :mod:`responses_cache.observability.otel`.

It re-exports that module's public names (the module moved when the package was grouped by
role). Patch or extend the module itself, not this one."""

from .observability.otel import (
    OpenTelemetryMetrics,
    OpenTelemetryTracer,
    configure_from_environment,
)

__all__ = [
    "OpenTelemetryMetrics",
    "OpenTelemetryTracer",
    "configure_from_environment",
]
