"""What operators see: metrics (:mod:`.metrics`), the tracing seam (:mod:`.tracing`) and its
OpenTelemetry implementation (:mod:`.otel`), structured logs (:mod:`.logs`).
"""
