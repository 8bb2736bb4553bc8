"""The bridge: WebSocket mode for *any* ASGI Responses app.

``WebSocketMode(app)`` without a service bridges each turn to ``app``'s own
``POST /v1/responses`` (``stream: true``), called in-process through ASGI — no sockets, no second
server. The middleware keeps the connection cache, so a continuation that sends only new items
reaches the wrapped app as one request with the whole conversation as input (and ``store:
false``): the app needs no ``previous_response_id`` support of its own and never loses context.
A ``previous_response_id`` that is not in the connection cache is handed to the app as is when
the request has ``store: true`` (the app's own store resolves it).

Credentials: the upgrade is authorized by asking the app (``GET /v1/models`` with the client's
``Authorization`` header), and every bridged request carries that header, so the wrapped app's
own authentication keeps working.

Needs the ``bridge`` extra (``httpx`` and ``httpx-sse``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from starlette.types import ASGIApp, Message

try:
    import httpx
    from httpx_sse import EventSource
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("the bridge needs `pip install responses-cache[bridge]` (httpx, httpx-sse)") from exc

from .backends.base import (
    BackendError,
    BackendEvent,
    EngineUsage,
    Finish,
    GenerationRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from .protocol.codec import encode

_FORWARDED = ("authorization",)


class _Exchange:
    """One in-process ASGI HTTP request whose response body is read as it streams."""

    def __init__(self, app: ASGIApp, method: str, path: str, headers: Mapping[str, str], body: bytes) -> None:
        self.app = app
        self.scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
            "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80),
        }
        self.body = body
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.started = asyncio.Event()
        self.chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._sent_body = False
        self._disconnect = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        #: What the app raised, if it raised (kept here: never left as an unretrieved task exception).
        self.error: BaseException | None = None

    async def _receive(self) -> Message:
        if not self._sent_body:
            self._sent_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self._disconnect.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers", []))
            self.started.set()
        elif message["type"] == "http.response.body":
            if message.get("body"):
                await self.chunks.put(bytes(message["body"]))
            if not message.get("more_body", False):
                await self.chunks.put(None)

    async def _run(self) -> None:
        try:
            await self.app(self.scope, self._receive, self._send)
        except Exception as exc:  # reported by whoever reads the exchange
            self.error = exc
        finally:
            self.started.set()
            await self.chunks.put(None)

    async def start(self) -> None:
        self.task = asyncio.ensure_future(self._run())
        await self.started.wait()

    async def stream(self) -> AsyncIterator[bytes]:
        while (chunk := await self.chunks.get()) is not None:
            yield chunk

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.stream()])

    async def close(self) -> None:
        self._disconnect.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


class AppBackend:
    """A :class:`~responses_cache.backends.base.Backend` that forwards to a wrapped app."""

    accepts_media = True

    def __init__(self, app: ASGIApp, *, path: str = "/v1/responses", models: Sequence[str] = ()) -> None:
        self.app = app
        self.path = path
        self._models = list(models)

    def models(self) -> Sequence[str]:
        return self._models

    def _body(self, request: GenerationRequest) -> bytes:
        items = request.conversation.items()
        body: dict[str, Any] = {
            "model": request.model,
            "input": items,
            "instructions": request.instructions,
            "tools": json.loads(request.tools.raw or b"[]"),
            "tool_choice": request.tool_choice,
            "parallel_tool_calls": request.parallel_tool_calls,
            "stream": True,
            "store": request.previous_response_id is not None,
        }
        if request.previous_response_id is not None:
            body["previous_response_id"] = request.previous_response_id
        for name in ("temperature", "top_p", "max_output_tokens", "reasoning"):
            value = getattr(request, name)
            if value is not None:
                body[name] = value
        if request.metadata:
            body["metadata"] = request.metadata
        return encode(body)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        headers.update({k: v for k, v in request.headers.items() if k in _FORWARDED})
        exchange = _Exchange(self.app, "POST", self.path, headers, self._body(request))
        try:
            await exchange.start()
            if exchange.status != 200:
                raise _error_of(exchange.status, await exchange.read())
            response = httpx.Response(
                exchange.status, headers=exchange.headers, stream=_Stream(exchange), request=httpx.Request("POST", "http://app")
            )
            async for sse in EventSource(response).aiter_sse():
                event = json.loads(sse.data)
                for translated in _translate(event):
                    yield translated
                    if isinstance(translated, Finish):
                        return
            raise BackendError("The wrapped app ended the stream without a terminal event.")
        finally:
            await exchange.close()


class _Stream(httpx.AsyncByteStream):
    """httpx's async byte stream over an in-process exchange."""

    def __init__(self, exchange: _Exchange) -> None:
        self.exchange = exchange

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.exchange.stream()

    async def aclose(self) -> None:
        await self.exchange.close()


def _translate(event: dict[str, Any]) -> list[BackendEvent]:
    kind = event.get("type")
    if kind == "response.output_text.delta":
        return [TextDelta(event["delta"])]
    if kind == "response.reasoning_text.delta":
        return [ReasoningDelta(event["delta"])]
    if kind == "response.function_call_arguments.delta":
        return [ToolCallDelta(event["delta"])]
    if kind == "response.output_item.added":
        item = event.get("item") or {}
        if item.get("type") == "function_call":
            return [ToolCallStart(name=item["name"], call_id=item.get("call_id"), namespace=item.get("namespace"))]
        return []
    if kind in ("response.completed", "response.incomplete"):
        response = event.get("response") or {}
        usage = response.get("usage") or {}
        engine = EngineUsage(
            prompt_tokens=usage.get("input_tokens"),
            cached_tokens=(usage.get("input_tokens_details") or {}).get("cached_tokens"),
            output_tokens=usage.get("output_tokens"),
            reasoning_tokens=(usage.get("output_tokens_details") or {}).get("reasoning_tokens"),
        )
        reason = ((response.get("incomplete_details") or {}).get("reason")) if kind == "response.incomplete" else None
        return [Finish("length" if reason == "max_output_tokens" else "content_filter" if reason else "stop", engine)]
    if kind == "response.failed":
        error = (event.get("response") or {}).get("error") or {}
        raise BackendError(error.get("message", "The wrapped app failed."), error.get("code", "server_error"))
    if kind == "error":
        error = event.get("error") or event
        raise BackendError(str(error.get("message", "The wrapped app failed.")), str(error.get("code") or "server_error"))
    return []


def _error_of(status: int, body: bytes) -> BackendError:
    """The wrapped app refused the request: its error becomes the response's failure."""
    try:
        error = json.loads(body)["error"]
        return BackendError(str(error["message"]), str(error.get("code") or "server_error"))
    except (ValueError, KeyError, TypeError):
        return BackendError(f"The wrapped app answered HTTP {status}.")


class AppAuthenticator:
    """Authorizes an upgrade by asking the wrapped app (``GET /v1/models``) with the client's
    ``Authorization`` header: admitted only on a 2xx answer; the tenant is derived from that
    credential."""

    def __init__(self, app: ASGIApp, *, path: str = "/v1/models") -> None:
        self.app = app
        self.path = path

    async def authenticate(self, headers: Mapping[str, str]) -> str | None:
        forwarded = {k: headers[k] for k in _FORWARDED if k in headers}
        exchange = _Exchange(self.app, "GET", self.path, forwarded, b"")
        try:
            await exchange.start()
            await exchange.read()
        finally:
            await exchange.close()
        # Fail closed: only a 2xx admits. A 400 or 404 (a proxy that checks keys elsewhere), a
        # 500 or an exception are refusals, never "probably fine".
        if exchange.error is not None or not 200 <= exchange.status < 300:
            return None
        credential = forwarded.get("authorization", "")
        return "bridge-" + hashlib.sha256(credential.encode()).hexdigest()[:12] if credential else "default"
