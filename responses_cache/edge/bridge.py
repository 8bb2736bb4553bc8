"""The bridge: WebSocket mode for *any* ASGI Responses app.

``WebSocketMode(app)`` without a service bridges each turn to ``app``'s own
``POST /v1/responses`` (``stream: true``), called in-process through ASGI — no sockets, no second
server. The middleware keeps the connection cache, so a continuation that sends only new items
reaches the wrapped app as one request with the whole conversation as input (and ``store:
false``): the app needs no ``previous_response_id`` support of its own and never loses context.
Every other field the client set is forwarded as sent; the bridge owns only ``input``,
``previous_response_id``, ``store`` and ``stream``. A ``previous_response_id`` that is not in the
connection cache (``store: true``) is handed to the app only if the app resolves ids itself
(configured, or probed once); otherwise the client gets ``previous_response_not_found``.

Credentials: the upgrade is authorized by asking the app (``GET /v1/models`` with the client's
``Authorization`` header; only a 2xx admits), and every bridged request carries that header, so
the wrapped app's own authentication keeps working. A refusal before streaming (any status but
200) reaches the client as an ``error`` with the app's status and message.

In-process requests carry what the server and the host app put into a real request's scope and
handlers read: the host application (``scope["app"]``: ``request.app.state``, as FastAPI apps and
vLLM's handlers use it) and the lifespan state (``scope["state"]``: ``request.state``). Under
``app.add_middleware(WebSocketMode)`` the wrapped app is the host's inner stack, which does not
set them itself; they are taken from the upgrade's own scope (:class:`HostScope`).

Needs the ``bridge`` extra (``httpx`` and ``httpx-sse``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any

import msgspec
from starlette.types import ASGIApp, Message

try:
    import httpx
    from httpx_sse import EventSource
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("the bridge needs `pip install responses-cache[bridge]` (httpx, httpx-sse)") from exc

from ..backends.base import (
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
from ..core.runtime import Service
from ..protocol.codec import encode
from ..protocol.errors import ResponsesError
from .host import HostScope

_FORWARDED = ("authorization",)


class _Exchange:
    """One in-process ASGI HTTP request whose response body is read as it streams."""

    def __init__(
        self, app: ASGIApp, method: str, path: str, headers: Mapping[str, str], body: bytes, host: HostScope
    ) -> None:
        self.app = app
        self.scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
            "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80),
        }
        host.apply(self.scope)
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


#: Fields the bridge sets itself on every forwarded request.
_OWNED = frozenset({"input", "previous_response_id", "store", "stream"})


class AppBackend:
    """A :class:`~responses_cache.backends.base.Backend` that forwards to a wrapped app.

    ``resolves_previous_response_ids``: whether the app looks up a ``previous_response_id`` it is
    given (its own store). ``None`` (default): find out by asking once, with an id that cannot
    exist: an app that answers with an error has looked it up; one that answers 2xx ignored it.
    An uncached ``previous_response_id`` is handed to the app only when it resolves ids;
    otherwise the client gets ``previous_response_not_found``, never a reply without its context.
    ``host``: what each request's scope gets from the host (see :class:`HostScope`)."""

    accepts_media = True

    def __init__(
        self,
        app: ASGIApp,
        *,
        path: str = "/v1/responses",
        models: Sequence[str] = (),
        resolves_previous_response_ids: bool | None = None,
        host: HostScope | None = None,
    ) -> None:
        self.app = app
        self.host = host or HostScope()
        self.path = path
        self._models = list(models)
        self.resolves_ids = resolves_previous_response_ids
        self.probes = 0

    def models(self) -> Sequence[str]:
        return self._models

    def _body(self, request: GenerationRequest) -> bytes:
        # Every field the client set reaches the app (structured output, logprobs, user, …),
        # except the ones the bridge owns.
        body: dict[str, Any] = {k: v for k, v in request.client_fields.items() if k not in _OWNED}
        body["model"] = request.model
        body["input"] = request.conversation.items()
        if request.tools.raw and request.tools.raw != b"[]":
            body["tools"] = msgspec.Raw(request.tools.raw)
        body["stream"] = True
        body["store"] = request.previous_response_id is not None
        if request.previous_response_id is not None:
            body["previous_response_id"] = request.previous_response_id
        return encode(body)

    def _headers(self, request_headers: Mapping[str, str], *, stream: bool) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "text/event-stream" if stream else "application/json"}
        headers.update({k: v for k, v in request_headers.items() if k in _FORWARDED})
        return headers

    async def open_stream(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        """Send the request and wait for the app's answer to begin: a refusal (any status but
        200, or an exception) is raised here, before the response exists, as the app's error."""
        headers = {**self._headers(request.headers, stream=True), **request.trace_context}
        exchange = _Exchange(self.app, "POST", self.path, headers, self._body(request), self.host)
        try:
            await exchange.start()
            if exchange.status != 200:
                body = await exchange.read()
                raise _refusal(exchange, body)
        except BaseException:
            await exchange.close()
            raise
        return self._events(exchange)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        events = await self.open_stream(request)
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()

    async def _events(self, exchange: _Exchange) -> AsyncGenerator[BackendEvent, None]:
        try:
            response = httpx.Response(
                exchange.status, headers=exchange.headers, stream=_Stream(exchange), request=httpx.Request("POST", "http://app")
            )
            async for sse in EventSource(response).aiter_sse():
                try:
                    event = json.loads(sse.data)
                except ValueError:
                    raise BackendError("The wrapped app sent an event that is not JSON.") from None
                if not isinstance(event, dict):
                    continue
                for translated in _translate(event):
                    yield translated
                    if isinstance(translated, Finish):
                        return
            if exchange.error is not None:
                raise BackendError(f"The wrapped app failed during the response ({type(exchange.error).__name__}).")
            raise BackendError("The wrapped app ended the stream without a terminal event.")
        finally:
            await exchange.close()

    async def resolves_previous_response_ids(self, model: str, headers: Mapping[str, str]) -> bool:
        """Whether the app resolves ``previous_response_id`` itself (configured, or probed once)."""
        if self.resolves_ids is not None:
            return self.resolves_ids
        self.probes += 1
        probe = encode({
            "model": model, "input": "ping", "previous_response_id": f"resp_responses_cache_probe_{secrets.token_hex(12)}",
            "store": False, "stream": False, "max_output_tokens": 16,
        })
        exchange = _Exchange(self.app, "POST", self.path, self._headers(headers, stream=False), probe, self.host)
        try:
            await exchange.start()
            body = await exchange.read()
        finally:
            await exchange.close()
        if exchange.error is not None or exchange.status in (0, 401, 403, 429) or exchange.status >= 500:
            return False  # no answer this time: fail closed now, ask again next time
        if 200 <= exchange.status < 300:
            self.resolves_ids = False  # it answered without the (impossible) parent: it ignores the field
        else:
            self.resolves_ids = exchange.status == 404 or b"previous_response" in body
        return self.resolves_ids


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
    if kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
        return [ToolCallDelta(event["delta"])]
    if kind == "response.output_item.added":
        item = event.get("item") or {}
        if item.get("type") == "function_call":
            return [ToolCallStart(name=item["name"], call_id=item.get("call_id"), namespace=item.get("namespace"))]
        if item.get("type") == "custom_tool_call":
            return [ToolCallStart(name=item["name"], call_id=item.get("call_id"), namespace=item.get("namespace"), custom=True)]
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


def _refusal(exchange: _Exchange, body: bytes) -> ResponsesError:
    """The wrapped app refused the request before streaming: its status and message, as it would
    have answered over HTTP (an OpenAI error envelope, or FastAPI's ``{"detail": ...}``)."""
    status = exchange.status
    if exchange.error is not None:  # raised (Starlette may also have answered 500 on its way out)
        return ResponsesError(
            f"The wrapped app failed while handling the request ({type(exchange.error).__name__}).",
            status=500, type="server_error", code="server_error",
        )
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    status = status if 400 <= status < 600 else 502
    message, code, param = f"The wrapped app answered HTTP {exchange.status}.", None, None
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        error = payload["error"]
        message = str(error.get("message") or message)
        kind = str(error.get("type") or kind)
        code = str(error["code"]) if error.get("code") is not None else None
        param = str(error["param"]) if error.get("param") is not None else None
    elif isinstance(payload, dict) and "detail" in payload:
        detail = payload["detail"]
        if isinstance(detail, str):
            message = detail
        elif isinstance(detail, list) and detail and isinstance(detail[0], dict):  # FastAPI validation errors
            first = detail[0]
            message = str(first.get("msg") or message)
            location = [str(p) for p in first.get("loc") or () if p != "body"]
            param = ".".join(location) or None
        else:
            message = json.dumps(detail)
    elif isinstance(payload, dict) and isinstance(payload.get("message"), str):
        message = payload["message"]
    return ResponsesError(message, status=status, type=kind, code=code, param=param)


class AppAuthenticator:
    """Authorizes an upgrade by asking the wrapped app (``GET /v1/models``) with the client's
    ``Authorization`` header: admitted only on a 2xx answer; the tenant is derived from that
    credential."""

    def __init__(self, app: ASGIApp, *, path: str = "/v1/models", host: HostScope | None = None) -> None:
        self.app = app
        self.host = host or HostScope()
        self.path = path

    async def authenticate(self, headers: Mapping[str, str]) -> str | None:
        forwarded = {k: headers[k] for k in _FORWARDED if k in headers}
        exchange = _Exchange(self.app, "GET", self.path, forwarded, b"", self.host)
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


def bridge_service(
    app: ASGIApp, *, resolves_previous_response_ids: bool | None = None, host: HostScope | None = None
) -> Service:
    """A service whose every turn is forwarded to ``app``'s own ``POST /v1/responses``; upgrades
    are authorized by ``app`` (:class:`AppAuthenticator`). ``host``: what each in-process
    request's scope gets from the host (:class:`HostScope`, observed by ``WebSocketMode``)."""
    from ..backends.routing import Route, StaticRouter
    from ..core.responder import Responder
    from ..observability.metrics import NullMetrics
    from ..pipeline.pipeline import Pipeline
    from ..session.session import SessionConfig

    host = host or HostScope()
    backend = AppBackend(app, resolves_previous_response_ids=resolves_previous_response_ids, host=host)
    route = Route(name="bridge", model="*", backend=backend, renderer=None)
    core = Responder(StaticRouter({}, default=route), Pipeline(), None, delegate_misses=backend)
    return Service(
        core=core,
        authenticator=AppAuthenticator(app, host=host),
        session=SessionConfig(),
        metrics=NullMetrics(),
    )
