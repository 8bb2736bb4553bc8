"""``responses_cache.engines``, the documented import path of :mod:`responses_cache.backends.engines`.

It re-exports that module's public names (the module moved when the package was grouped by
role). Patch or extend the module itself, not this one."""

from .backends.engines import (
    RETRYABLE_STATUS,
    EngineUnavailable,
    IncrementalDecoder,
    body_message,
    finish_error,
    http_error,
    message_of,
    refusal,
    retry_after,
    stream_error,
)

__all__ = [
    "RETRYABLE_STATUS",
    "EngineUnavailable",
    "IncrementalDecoder",
    "body_message",
    "finish_error",
    "http_error",
    "message_of",
    "refusal",
    "retry_after",
    "stream_error",
]
