"""The OpenAI error envelope and the exception that carries it through the pipeline.

Every stage raises :class:`ResponsesError`; the edges turn it into the right wire shape: an HTTP
status with ``{"error": {...}}``, an SSE ``error`` event, or a WebSocket ``error`` event that also
carries the top-level ``status``.
"""

from __future__ import annotations

import re

import msgspec


class ErrorPayload(msgspec.Struct, frozen=True):
    type: str
    code: str | None
    message: str
    param: str | None


class HTTPErrorBody(msgspec.Struct, frozen=True):
    error: ErrorPayload


class ResponsesError(Exception):
    """A request failure with its HTTP status and OpenAI error fields."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.code = code
        self.param = param
        #: HTTP headers of the answer (``retry-after`` and ``x-ratelimit-*`` of a quota refusal);
        #: over WebSocket, the ``error`` event's top-level ``headers``.
        self.headers: dict[str, str] | None = None

    @property
    def payload(self) -> ErrorPayload:
        return ErrorPayload(self.type, self.code, self.message, self.param)

    def __repr__(self) -> str:
        return f"ResponsesError({self.status}, {self.code!r}, {self.message!r}, param={self.param!r})"


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> ResponsesError:
    return ResponsesError(message, status=400, code=code, param=param)


def previous_response_not_found(response_id: str) -> ResponsesError:
    return ResponsesError(
        f"Previous response with id '{response_id}' not found.",
        code="previous_response_not_found",
        param="previous_response_id",
    )


def server_error(message: str = "The server had an error while processing your request.") -> ResponsesError:
    return ResponsesError(message, status=500, type="server_error", code="server_error")


def shutting_down() -> ResponsesError:
    """503 for a request or upgrade that reaches a draining process: the SDKs retry a 503 (after
    ``retry-after``), and behind a load balancer the retry reaches another process."""
    error = ResponsesError(
        "This server is shutting down; retry the request.", status=503, type="server_error", code="server_shutting_down"
    )
    error.headers = {"retry-after": "1", "connection": "close"}
    return error


_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def from_validation_error(exc: msgspec.ValidationError | msgspec.DecodeError, prefix: str = "") -> ResponsesError:
    """Turn a msgspec error (which names the JSON path) into a 400 with ``param`` set."""
    text = str(exc)
    match = _PATH.search(text)
    path = match.group("path") if match else ""
    message = text[: match.start()] if match else text
    param = (prefix + path).lstrip(".") or None
    code = "invalid_type" if message.startswith("Expected") else "invalid_value"
    if message.startswith("Object missing required field"):
        code = "missing_required_parameter"
        field = message.split("`")[1] if "`" in message else ""
        param = ".".join(p for p in (param, field) if p) or None
        message = f"Missing required parameter: '{param}'."
    elif param:
        message = f"Invalid value for '{param}': {message[0].lower()}{message[1:]}."
    return invalid_request(message, param, code)
