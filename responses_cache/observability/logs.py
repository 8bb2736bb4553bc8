"""Structured logs: one JSON object per line (``serve --log-json``).

Every finished turn logs one ``responses_cache.turns`` record (INFO; WARNING when it failed)
whose fields — response and trace ids, tenant, model, transport, status, the tier its parent came
from, tokens rendered and reused, time to first token, overhead — become keys of the line. Any
other record logged while a turn runs (an error in a hook, the store, the engine adapter) carries
that turn's ``response_id`` and ``trace_id`` too, from :data:`current_turn`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

#: ``(response_id, trace_id)`` of the turn the running task is serving (set when its parent is
#: looked up; inherited by tasks it starts).
current_turn: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "responses_cache_turn", default=None
)


class JsonFormatter(logging.Formatter):
    """A log record as one line of JSON: ``ts`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the turn's fields (``record.turn``) or ids, and ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "turn", None)
        if isinstance(fields, dict):
            line.update(fields)
        else:
            ids = current_turn.get()
            if ids is not None:
                line["response_id"], line["trace_id"] = ids
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def use_json_logs(level: int | str = logging.INFO, stream: Any = None) -> logging.Handler:
    """Send every ``responses_cache`` log record to ``stream`` (stderr) as JSON lines, at
    ``level`` and above (INFO includes the line per turn). Returns the handler it installed."""
    return _send_logs(JsonFormatter(), level, stream)


def use_text_logs(level: int | str = logging.INFO, stream: Any = None) -> logging.Handler:
    """Send every ``responses_cache`` log record to ``stream`` (stderr) as ``LEVEL: message``
    lines, at ``level`` and above (``serve --log-level info``: the drain's progress, the line per
    turn). Returns the handler it installed."""
    return _send_logs(logging.Formatter("%(levelname)s: %(message)s"), level, stream)


def _send_logs(formatter: logging.Formatter, level: int | str, stream: Any) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    logger = logging.getLogger("responses_cache")
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # one line per record, not one more from the root logger
    return handler
