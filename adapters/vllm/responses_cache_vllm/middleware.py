"""WebSocket mode inside vLLM's own server::

    RESPONSES_CACHE_MODEL=openai/gpt-oss-20b VLLM_API_KEY=sk-... \\
    vllm serve openai/gpt-oss-20b --enable-scale-out --enable-prefix-caching --enable-prompt-tokens-details \\
        --middleware responses_cache_vllm.middleware.ResponsesCacheMiddleware

vLLM passes a middleware class to ``app.add_middleware(cls)`` with no arguments, so
:class:`ResponsesCacheMiddleware` is a pure ASGI class (``__init__(self, app)``) configured from
environment variables. It answers WebSocket connections on ``/v1/responses`` itself (keeping the
connection's token log) and generates through vLLM's engine client itself (``AsyncLLM``, the
object vLLM's routes call: token ids in, sampled ids out, no HTTP request, JSON chunk or SSE frame
per token; :mod:`.in_process`). With ``RESPONSES_CACHE_ENDPOINT=generate`` or ``completions`` it
calls vLLM's own ``POST /inference/v1/generate`` (when vLLM runs with ``--enable-scale-out``) or
``POST /v1/completions`` with token ids instead, **in-process** through ASGI. Either way: no
network hop, no re-tokenization.
Everything else (vLLM's HTTP Responses API included, unless ``RESPONSES_CACHE_HTTP=1``) goes to
vLLM untouched.

Environment:

==============================  ===============================================================
``RESPONSES_CACHE_MODEL``       the served model name (required)
``RESPONSES_CACHE_TEMPLATE``    the renderer template (default ``harmony``)
``RESPONSES_CACHE_PATH``        the path taken over (default ``/v1/responses``)
``RESPONSES_CACHE_HTTP``        ``1``: also serve HTTP ``POST`` on that path (default: WebSocket only)
``RESPONSES_CACHE_ENDPOINT``    ``auto`` (default: vLLM's engine client), ``generate`` or
                                ``completions`` (that HTTP route, in-process)
``RESPONSES_CACHE_LOG_LEVEL``   the level of this package's log records (default: vLLM's,
                                ``VLLM_LOGGING_LEVEL``; ``INFO`` includes a line per turn)
``VLLM_API_KEY``                the key vLLM checks (``--api-key``); checked here too
==============================  ===============================================================

Besides these it reads the package's ``RESPONSES_CACHE_VOCAB_DIR``, ``RESPONSES_CACHE_DIR``,
``RESPONSES_CACHE_HF_FAST`` and the adapter's ``RESPONSES_CACHE_SALT_KEY``; any other
``RESPONSES_CACHE_*`` variable (a typo, or a ``responses-cache serve`` setting, which does not apply
inside vLLM) stops the start with an error naming it.

The package's log records (a turn that failed, a drain's deadline, the line per turn) go to vLLM's
own log handlers, formatted as vLLM's lines, unless a logging configuration gave the
``responses_cache`` logger handlers of its own or vLLM's logging is off (``VLLM_CONFIGURE_LOGGING=0``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import httpx

from responses_cache import HostScope, create_app

from .in_process import InProcessBackend

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: How long a closed in-process response may take to finish after its client went away.
_DRAIN_S = 5.0

_PREFIX = "RESPONSES_CACHE_"
#: The package's and the adapter's own variables, read where they apply.
_ELSEWHERE = frozenset(_PREFIX + name for name in ("VOCAB_DIR", "DIR", "HF_FAST", "SALT_KEY"))
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class MiddlewareSettings:
    """What the middleware is configured with (the module docstring's table)."""

    model: str
    template: str = "harmony"
    path: str = "/v1/responses"
    http: bool = False
    endpoint: str = "auto"
    log_level: str | None = None
    api_key: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MiddlewareSettings:
        """The settings ``env`` gives; ``ValueError`` naming the variable for one that is missing,
        unknown or not a value it takes."""
        read = {_PREFIX + name for name in ("MODEL", "TEMPLATE", "PATH", "HTTP", "ENDPOINT", "LOG_LEVEL")}
        unknown = sorted(k for k in env if k.startswith(_PREFIX) and k not in read and k not in _ELSEWHERE)
        if unknown:
            raise ValueError(
                f"ResponsesCacheMiddleware does not read {', '.join(unknown)}: its variables are "
                f"{', '.join(sorted(read))} (a `responses-cache serve` setting does not apply inside vLLM)"
            )
        model = env.get(_PREFIX + "MODEL")
        if not model:
            raise ValueError("ResponsesCacheMiddleware needs RESPONSES_CACHE_MODEL (the served model name)")
        http = env.get(_PREFIX + "HTTP", "").strip().lower()
        if http not in _TRUE + _FALSE:
            raise ValueError(f"RESPONSES_CACHE_HTTP={http!r} is not a boolean (1, true, yes, on; 0, false, no, off)")
        path = env.get(_PREFIX + "PATH", "/v1/responses")
        if not path.startswith("/"):
            raise ValueError(f"RESPONSES_CACHE_PATH={path!r} is not a path (it starts with '/')")
        log_level = env.get(_PREFIX + "LOG_LEVEL")
        if log_level is not None and not isinstance(logging.getLevelName(log_level.upper()), int):
            raise ValueError(f"RESPONSES_CACHE_LOG_LEVEL={log_level!r} is not a logging level (debug, info, warning, error)")
        return cls(
            model=model,
            template=env.get(_PREFIX + "TEMPLATE", "harmony"),
            path=path,
            http=http in _TRUE,
            endpoint=env.get(_PREFIX + "ENDPOINT", "auto"),
            log_level=log_level,
            api_key=env.get("VLLM_API_KEY") or None,
        )


class InProcessTransport(httpx.AsyncBaseTransport):
    """An httpx transport that calls an ASGI app in this process and **streams** its answer
    (httpx's own ``ASGITransport`` collects the whole body first). Closing the response early
    tells the app the client disconnected, as a socket close would.

    Each request's scope carries what the host server put in the scopes handed to the middleware
    (:class:`~responses_cache.HostScope`): the host application as ``scope["app"]`` (vLLM's
    handlers read ``request.app.state``) and a copy of the lifespan ``state``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.host = HostScope()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        url = request.url
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.raw_path.split(b"?")[0],
            "query_string": url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", 0),
            "server": (url.host, url.port or 80),
        }
        self.host.apply(scope)
        messages: asyncio.Queue[Message | BaseException | None] = asyncio.Queue()
        disconnected = asyncio.Event()
        sent_body = False

        async def receive() -> Message:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            await messages.put(message)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            except Exception as exc:
                await messages.put(exc)
            finally:
                await messages.put(None)

        task = asyncio.ensure_future(run())
        start = await messages.get()
        if not isinstance(start, MutableMapping) or start.get("type") != "http.response.start":
            disconnected.set()
            await _finish(task)
            raise httpx.RemoteProtocolError(f"the in-process app did not answer: {start!r}", request=request)
        headers = [(bytes(k), bytes(v)) for k, v in start.get("headers", [])]
        return httpx.Response(
            int(start["status"]), headers=headers, stream=_Body(messages, task, disconnected), request=request
        )


class _Body(httpx.AsyncByteStream):
    def __init__(self, messages: asyncio.Queue[Message | BaseException | None], task: asyncio.Future[None],
                 disconnected: asyncio.Event) -> None:
        self._messages = messages
        self._task = task
        self._disconnected = disconnected

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            message = await self._messages.get()
            if message is None:
                return
            if isinstance(message, BaseException):
                raise httpx.ReadError(f"the in-process app failed: {message}") from message
            if message.get("type") == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    return

    async def aclose(self) -> None:
        self._disconnected.set()
        await _finish(self._task)


async def _finish(task: asyncio.Future[None]) -> None:
    """Let the app notice the disconnect and end; cancel it if it does not in time."""
    if task.done():
        return
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), _DRAIN_S)
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def log_where_vllm_logs(level: str | None = None) -> None:
    """Hand the ``responses_cache`` logger vLLM's handlers, at ``level`` (default: the ``vllm``
    logger's). Inside ``vllm serve`` nothing else would show its records: vLLM configures only its
    own logger, and the root logger there drops everything under ERROR. Nothing changes where the
    ``responses_cache`` logger already has handlers (a logging configuration of the user's) or
    where vLLM configured no handler of its own (``VLLM_CONFIGURE_LOGGING=0``)."""
    ours, theirs = logging.getLogger("responses_cache"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(level.upper() if level is not None else theirs.getEffectiveLevel())
    ours.propagate = False  # the root logger's handlers (if any) would print each record again


class ResponsesCacheMiddleware:
    """``vllm serve --middleware responses_cache_vllm.middleware.ResponsesCacheMiddleware``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        settings = MiddlewareSettings.from_env(os.environ)
        log_where_vllm_logs(settings.log_level)
        self.path, self.http = settings.path, settings.http
        self.transport = InProcessTransport(app)
        api_key = settings.api_key
        self.backend = InProcessBackend(
            "http://vllm.in-process",
            engine_client=self._engine_client if settings.endpoint == "auto" else lambda: None,
            model=settings.model,
            engine="vllm",
            endpoint=settings.endpoint,
            template=settings.template,
            api_key=api_key,  # vLLM's own check sees the key on the in-process call
            routing_headers=False,  # one process: nothing to route
            transport=self.transport,
        )
        self.inner = create_app(backend=self.backend, renderer=settings.template, api_keys=[api_key] if api_key else None)

    def _engine_client(self) -> Any:
        """vLLM's engine client (``app.state.engine_client``), once a request showed the app."""
        return getattr(getattr(self.transport.host.app, "state", None), "engine_client", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.transport.host.observe(scope)
        kind = scope["type"]
        if scope.get("path") == self.path and (kind == "websocket" or (kind == "http" and self.http)):
            await self.inner(scope, receive, send)
        else:
            await self.app(scope, receive, send)
