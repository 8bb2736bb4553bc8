"""``create_app``: the reference server (HTTP + SSE + WebSocket mode) in one ASGI app."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response as HTTPResponse
from starlette.routing import Route as HTTPRoute

from .auth import AllowAll, Authenticator, BearerKeys
from .backends.base import Backend
from .backends.simulated import SimulatedEngine
from .http_api import HTTPApi
from .metrics import InMemoryMetrics, Metrics, PrometheusMetrics
from .pipeline.hooks import Hook, HookRunner
from .pipeline.pipeline import Pipeline, UsageSubmitter
from .pipeline.validate import Limits, Validator
from .protocol.tools import tool_cache
from .routing import Route, Router, StaticRouter
from .service import ResponsesService
from .session import InputBudget, SessionConfig
from .store import MemoryResponseStore, ResponseStore
from .websocket import WebSocketMode


@dataclass(slots=True)
class ServerConfig:
    """Everything :func:`create_app` takes, with defaults that serve the simulated engine."""

    backend: Backend | None = None
    router: Router | None = None
    renderer: str | None = "harmony"
    api_keys: Iterable[str] | Mapping[str, str] | None = None
    authenticator: Authenticator | None = None
    store: ResponseStore | None = None
    billing: UsageSubmitter | None = None
    hooks: Sequence[Hook] = ()
    limits: Limits = field(default_factory=Limits)
    session: SessionConfig = field(default_factory=SessionConfig)
    metrics: Metrics | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    #: Cap on the sum of all WebSocket connections' caches (least recently used give way).
    process_cache_bytes: int | None = 4 * 1024**3
    context_window: int = 131_072
    #: Cap on request bytes held by unfinished requests (WebSocket frames and HTTP bodies), all
    #: connections together.
    process_input_bytes: int | None = 1024**3
    #: A WebSocket write that waits on the peer longer aborts the connection.
    write_timeout_s: float = 30.0
    #: The process-wide parsed-tools cache, in bytes.
    tool_cache_bytes: int = 64 * 1024 * 1024
    #: Renders that tokenize at least this many characters run on a worker thread.
    offload_chars: int = 64 * 1024
    #: Worker threads for those renders (``None``: a quarter of the CPUs, at least one).
    tokenizer_threads: int | None = None
    #: Give each tenant its own engine prefix cache (``cache_salt``); ``False`` shares it.
    partition_prefix_cache: bool = True


def default_router(backend: Backend, renderer: str | None, context_window: int) -> StaticRouter:
    r = None
    if renderer:
        from .tokens import get_renderer

        r = get_renderer(renderer)
    route = Route(name="default", model=backend.models()[0], backend=backend, renderer=r, context_window=context_window)
    return StaticRouter({m: route for m in backend.models()}, default=route)


def create_app(config: ServerConfig | None = None, **options: object) -> Starlette:
    """Build the ASGI app. ``create_app()`` serves the simulated engine with defaults; keyword
    options override :class:`ServerConfig` fields (``create_app(api_keys=["sk-1"])``)."""
    cfg = config or ServerConfig()
    for name, value in options.items():
        if not hasattr(cfg, name):
            raise TypeError(f"create_app() got an unexpected option {name!r}")
        setattr(cfg, name, value)
    backend = cfg.backend or SimulatedEngine()
    router = cfg.router or default_router(backend, cfg.renderer, cfg.context_window)
    store = cfg.store if cfg.store is not None else MemoryResponseStore()
    metrics = cfg.metrics or InMemoryMetrics()
    authenticator = cfg.authenticator or (BearerKeys(cfg.api_keys) if cfg.api_keys else AllowAll())
    pipeline = Pipeline(
        store=store, hooks=HookRunner(cfg.hooks), validator=Validator(cfg.limits), billing=cfg.billing, metrics=metrics,
        offload_chars=cfg.offload_chars, tokenizer_threads=cfg.tokenizer_threads,
        partition_prefix_cache=cfg.partition_prefix_cache,
    )
    if tool_cache.max_bytes != cfg.tool_cache_bytes:
        tool_cache.resize(cfg.tool_cache_bytes)
    service = ResponsesService(router, pipeline, store)
    input_budget = InputBudget(cfg.process_input_bytes) if cfg.process_input_bytes else None
    api = HTTPApi(service, authenticator, max_body_bytes=cfg.max_body_bytes, input_budget=input_budget)
    billing = cfg.billing

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        start = getattr(billing, "start", None)
        if start is not None:
            await start()
        try:
            yield
        finally:
            pipeline.close()
            stop = getattr(billing, "stop", None)
            if stop is not None:
                await stop()

    routes = api.routes()
    if isinstance(metrics, PrometheusMetrics):
        exposition = metrics

        async def prometheus(request: Request) -> HTTPResponse:
            return HTTPResponse(exposition.exposition(), media_type=exposition.content_type)

        routes.append(HTTPRoute("/metrics", prometheus, methods=["GET"]))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(
        WebSocketMode,  # type: ignore[arg-type]
        service=service,
        authenticator=authenticator,
        config=cfg.session,
        max_message_bytes=cfg.max_body_bytes,
        metrics=metrics,
        process_cache_bytes=cfg.process_cache_bytes,
        input_budget=input_budget,
        write_timeout_s=cfg.write_timeout_s,
    )
    app.state.service = service
    app.state.metrics = metrics
    return app
