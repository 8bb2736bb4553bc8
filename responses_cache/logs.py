"""``responses_cache.logs``, the documented import path of :mod:`responses_cache.observability.logs`.

It re-exports that module's public names (the module moved when the package was grouped by
role). Patch or extend the module itself, not this one."""

from .observability.logs import (
    JsonFormatter,
    current_turn,
    use_json_logs,
)

__all__ = [
    "JsonFormatter",
    "current_turn",
    "use_json_logs",
]
