"""``responses_cache.engines``, the documented import path of :mod:`responses_cache.backends.engines`.

It re-exports that module's public names (the module moved when the package was grouped by
role). Patch or extend the module itself, not this one."""

from .backends.engines import (
    ACCEPTED,
    JSON_CONTENT_TYPE,
    RETRYABLE_STATUS,
    Accepted,
    EngineUnavailable,
    IncrementalDecoder,
    batched,
    body_message,
    finish_error,
    http_error,
    json_body,
    json_chunk,
    merge_deltas,
    message_of,
    refusal,
    retry_after,
    stream_error,
    until_accepted,
    without_marker,
)

__all__ = [
    "ACCEPTED",
    "JSON_CONTENT_TYPE",
    "RETRYABLE_STATUS",
    "Accepted",
    "EngineUnavailable",
    "IncrementalDecoder",
    "batched",
    "body_message",
    "finish_error",
    "http_error",
    "json_body",
    "json_chunk",
    "merge_deltas",
    "message_of",
    "refusal",
    "retry_after",
    "stream_error",
    "until_accepted",
    "without_marker",
]
