"""What adapters for OpenAI-compatible inference engines share (a public module).

* :class:`IncrementalDecoder`: sampled ids decoded locally with the renderer's encoding, holding
  incomplete UTF-8 back until the rest of the character arrives (token boundaries do not fall on
  character boundaries).
* Engine failures mapped to the error codes clients act on:

  * HTTP 400 about the context length -> ``context_length_exceeded``;
  * 429 -> ``rate_limit_exceeded`` with the engine's retry hint (``Retry-After``);
  * 502/503/504 and refused connections -> retryable: another replica is tried, as long as no
    token has been streamed yet;
  * an error chunk mid-stream, a finish reason ``abort``/``error``/``repetition`` -> a failed
    response (``server_error``), never a normal stop.

* :func:`refusal`: a failure before the engine accepted the request (its 4xx, our own checks)
  as the plain error an HTTP client would get, for a backend's ``open_stream`` to raise before
  the response exists (``response.failed`` takes only the codes of a generation failure).
* :data:`ACCEPTED`, :func:`until_accepted`, :func:`without_marker`: a backend's stream marks
  where the engine accepted the request; ``open_stream`` waits for the mark (a failure before it
  is a :func:`refusal`), ``generate`` streams past it.
* :func:`json_body` and :func:`json_chunk`: a request's JSON body and a streamed chunk's JSON,
  with msgspec (a token-id prompt of 30k ids encodes in ~0.15 ms, against ~2.5 ms with the
  standard library's encoder that httpx's ``json=`` uses; every streamed token's chunk is parsed).
* :func:`batched`: an engine's stream read in a task of its own, handed over as lists of the
  chunks that arrived while the turn was busy, so that tokens arriving together are decoded,
  parsed and sent to the client once (one delta, one frame) instead of once each;
  :func:`merge_deltas` joins the deltas of such a list for engines that stream text, not ids.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import msgspec

from ..engine_events import BackendEvent, ReasoningDelta, TextDelta, ToolCallDelta
from ..protocol.errors import ResponsesError
from .base import BackendError

T = TypeVar("T")

_CONTEXT = re.compile(
    r"context length|context window|maximum context|max_model_len|too long|prompt is too long|exceeds the max",
    re.IGNORECASE,
)
RETRYABLE_STATUS = frozenset({502, 503, 504})

#: A refusal's HTTP status, type and ``param`` by code (anything else: the server's fault).
_REFUSALS: dict[str, tuple[int, str, str | None]] = {
    "context_length_exceeded": (400, "invalid_request_error", "input"),
    "unsupported_value": (400, "invalid_request_error", "tool_choice"),
    "invalid_request_error": (400, "invalid_request_error", None),
    "rate_limit_exceeded": (429, "rate_limit_error", None),
}


def refusal(error: BackendError) -> ResponsesError:
    """A failure before the engine accepted the request, as a plain error with its HTTP status."""
    status, kind, param = _REFUSALS.get(error.code, (502, "server_error", None))
    code = error.code if error.code in _REFUSALS else "server_error"
    return ResponsesError(str(error), status=status, type=kind, code=code, param=param)


class Accepted:
    """The engine answered the request with 200: from here on a failure fails the response."""


#: The mark a backend's stream yields where the engine accepted the request.
ACCEPTED = Accepted()
Marked = AsyncGenerator[BackendEvent | Accepted, None]


async def until_accepted(stream: Marked) -> AsyncGenerator[BackendEvent, None]:
    """For ``open_stream``: wait until ``stream`` yields :data:`ACCEPTED` and return the rest of
    the generation; a :class:`~.base.BackendError` before it is raised as a :func:`refusal` (the
    response does not exist yet), and the stream is closed however the wait ends."""
    early: list[BackendEvent] = []
    try:
        async for event in stream:
            if isinstance(event, Accepted):
                break
            early.append(event)
    except BackendError as exc:
        await stream.aclose()
        raise refusal(exc) from exc
    except BaseException:
        await stream.aclose()
        raise
    return _rest(early, stream)


async def _rest(early: list[BackendEvent], stream: Marked) -> AsyncGenerator[BackendEvent, None]:
    try:
        for event in early:
            yield event
        async for step in stream:
            if not isinstance(step, Accepted):
                yield step
    finally:
        await stream.aclose()


async def without_marker(stream: Marked) -> AsyncGenerator[BackendEvent, None]:
    """For ``generate``: ``stream``'s events past the :data:`ACCEPTED` mark, closed however it ends."""
    try:
        async for step in stream:
            if not isinstance(step, Accepted):
                yield step
    finally:
        await stream.aclose()


class IncrementalDecoder:
    """``feed(ids)`` returns the text those ids complete; ``close()`` what is left."""

    def __init__(self, encoding: Any) -> None:
        self._encoding = encoding
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Sequence[int]) -> str:
        data: bytes = self._encoding.decode_bytes(list(ids))
        return str(self._utf8.decode(data))

    def close(self) -> str:
        return str(self._utf8.decode(b"", final=True))


class EngineUnavailable(Exception):
    """A replica could not take the request (try another one if nothing was streamed yet)."""

    def __init__(self, error: BackendError) -> None:
        super().__init__(str(error))
        self.error = error


def message_of(payload: Any) -> str:
    """The human message of an engine's error body (vLLM ``{"error": {...}}``, SGLang
    ``{"object": "error", "message": ...}``, FastAPI ``{"detail": ...}``, Cerebras top-level)."""
    if isinstance(payload, Mapping):
        inner = payload.get("error")
        if isinstance(inner, Mapping):
            return str(inner.get("message") or inner)
        if isinstance(inner, str):
            return inner
        for key in ("message", "detail"):
            if payload.get(key):
                return str(payload[key])
    return str(payload)[:500]


def retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None


def body_message(body: bytes) -> str:
    """The human message of an error answer's body: :func:`message_of` its JSON, else its text."""
    try:
        return message_of(json.loads(body))
    except ValueError:
        return body.decode(errors="replace")[:500]


def http_error(status: int, body: bytes, headers: Mapping[str, str]) -> BackendError:
    """The error for a non-200 answer (raise :class:`EngineUnavailable` for retryable ones)."""
    message = body_message(body)
    if status == 429:
        wait = retry_after(headers)
        hint = f" Please retry after {wait:g}s." if wait is not None else " Please retry later."
        return BackendError(f"The engine is rate limited: {message}.{hint}", "rate_limit_exceeded", retry_after=wait)
    if status == 400 and _CONTEXT.search(message):
        return BackendError(f"The prompt does not fit the model's context window: {message}", "context_length_exceeded")
    return BackendError(f"the engine answered HTTP {status}: {message}", "server_error")


def stream_error(payload: Any) -> BackendError:
    """An error chunk in the middle of a stream."""
    message = message_of(payload)
    if _CONTEXT.search(message):
        return BackendError(f"The prompt does not fit the model's context window: {message}", "context_length_exceeded")
    return BackendError(f"the engine failed mid-stream: {message}", "server_error")


def finish_error(reason: str, detail: str = "") -> BackendError:
    """Finish reasons that are not a normal end of generation."""
    what = {
        "abort": "the engine aborted the generation",
        "repetition": "the engine stopped a repetitive generation (finish_reason 'repetition')",
        "error": "the engine reported an error during generation",
    }.get(reason, f"the engine ended generation with finish_reason {reason!r}")
    return BackendError(f"{what}{': ' + detail if detail else ''}", "server_error")


#: The request header that goes with :func:`json_body`.
JSON_CONTENT_TYPE = {"Content-Type": "application/json"}
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def json_body(body: Mapping[str, Any]) -> bytes:
    """``body`` as JSON, for ``httpx``'s ``content=`` with :data:`JSON_CONTENT_TYPE`."""
    return _encode(body)


def json_chunk(data: str, engine: str) -> Any:
    """A streamed chunk's JSON; :class:`BackendError` (``server_error``) when it is not JSON.
    What msgspec refuses and the standard library takes (``NaN``, ``Infinity``) is read too."""
    try:
        return _decode(data)
    except msgspec.DecodeError:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise BackendError(f"{engine} sent a malformed chunk: {data[:200]!r}", "server_error") from exc



#: How many chunks :func:`batched` reads ahead of a consumer that is not taking them.
BATCH_LIMIT = 256


async def batched(source: AsyncGenerator[T, None], limit: int = BATCH_LIMIT) -> AsyncGenerator[list[T], None]:
    """``source``'s items in order, as lists: each list holds what arrived while the consumer was
    busy with the previous one. Nothing waits for a batch to fill: an item that arrives alone is
    handed over alone, at once; when the engine streams faster than a turn handles its tokens,
    the tokens that queued up are handled (decoded, parsed, sent) as one.

    ``source`` is read by a task of its own, at most ``limit`` items ahead of the consumer (a
    client that does not read stops the engine's stream being read). An error of ``source``
    reaches the consumer after the items before it. Closing the batches (or cancelling their
    consumer) cancels the read and closes ``source``; use ``contextlib.aclosing``.

    The read is cancelled through an anyio cancel scope, not ``Task.cancel()``: a source's
    shielded cleanup then runs to its end. httpx's does (httpcore hands the connection back to
    its pool in a shielded scope); a plain task cancellation landing there, as the consumer
    closes on the engine's last chunk while the reader finishes the response, left the
    connection checked out for good, one a turn, until the pool was empty."""
    loop = asyncio.get_running_loop()
    scope = anyio.CancelScope()
    ready: list[T] = []
    wake: asyncio.Future[None] | None = None  # the consumer, waiting for an item
    room: asyncio.Future[None] | None = None  # the reader, waiting for the consumer
    failure: BaseException | None = None
    ended = False

    def nudge(future: asyncio.Future[None] | None) -> None:
        if future is not None and not future.done():
            future.set_result(None)

    async def read() -> None:
        nonlocal room, failure, ended
        try:
            with scope:  # cancelled by the consumer's close: the read ends quietly
                async with contextlib.aclosing(source):
                    async for item in source:
                        ready.append(item)
                        nudge(wake)
                        if len(ready) >= limit:
                            room = loop.create_future()
                            await room
        except BaseException as exc:  # handed to the consumer, after the items before it
            failure = exc
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            ended = True
            nudge(wake)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            if ready:
                batch, ready = ready, []
                nudge(room)
                yield batch
            elif ended:
                if failure is not None:
                    raise failure
                return
            else:
                wake = loop.create_future()
                await wake
                wake = None
    finally:
        scope.cancel()
        try:
            await reader
        except asyncio.CancelledError:
            if not reader.done():
                raise  # this consumer is cancelled while the read unwinds


def merge_deltas(events: Sequence[BackendEvent]) -> list[BackendEvent]:
    """``events`` with each run of deltas of one kind (text, reasoning, a call's arguments) joined
    into one delta, their token ids with it; anything else stays where it is."""
    merged: list[BackendEvent] = []
    for event in events:
        last = merged[-1] if merged else None
        if isinstance(event, ToolCallDelta) and isinstance(last, ToolCallDelta):
            merged[-1] = ToolCallDelta(last.arguments + event.arguments, [*last.token_ids, *event.token_ids])
        elif isinstance(event, (TextDelta, ReasoningDelta)) and type(last) is type(event):
            assert isinstance(last, (TextDelta, ReasoningDelta))
            merged[-1] = type(event)(last.text + event.text, [*last.token_ids, *event.token_ids])
        else:
            merged.append(event)
    return merged
