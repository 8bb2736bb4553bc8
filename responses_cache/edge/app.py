"""Building a responses-cache: :func:`create_service` (to mount in any ASGI app) and
:func:`create_app` (the reference server: HTTP, SSE and WebSocket mode in one ASGI app)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, fields, replace
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response as HTTPResponse
from starlette.routing import Route as HTTPRoute

from ..backends.base import Backend
from ..backends.routing import Route, Router, StaticRouter
from ..backends.simulated import SimulatedEngine
from ..billing import Biller
from ..conversation.compaction import DEFAULT_TTL_S as DEFAULT_COMPACTION_TTL_S
from ..conversation.sealing import Sealer
from ..core.auth import AllowAll, Authenticator, BearerKeys
from ..core.background import BackgroundRunner
from ..core.lifecycle import Drain, Resources
from ..core.responder import Responder
from ..core.runtime import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_OUTBOUND_BYTES,
    DEFAULT_PROCESS_CACHE_BYTES,
    DEFAULT_PROCESS_INPUT_BYTES,
    DEFAULT_WRITE_TIMEOUT_S,
    Service,
)
from ..limits.fairness import FairGate
from ..limits.input_rate import InputRate, InputRateLimits
from ..limits.quotas import QuotaConfig, Quotas, RateLimiter
from ..observability.metrics import InMemoryMetrics, Metrics, MetricsTee, PrometheusMetrics
from ..observability.tracing import Tracer
from ..pipeline.compact import DEFAULT_SUMMARY_TOKENS
from ..pipeline.hooks import Hook, HookRunner
from ..pipeline.pipeline import Pipeline, UsageSubmitter
from ..pipeline.validate import Limits, Validator
from ..protocol.tools import DEFAULT_TOOL_CACHE_BYTES, tool_cache
from ..session.session import InputBudget, SessionConfig
from ..storage.hot import HotCache
from ..storage.store import (
    DEFAULT_STORE_BYTES,
    DEFAULT_STORE_TENANT_BYTES,
    Bound,
    MemoryResponseStore,
    ResponseStore,
)
from .http_api import HTTPApi
from .websocket import WebSocketMode


@dataclass(slots=True)
class ServerConfig:
    """Everything :func:`create_service` and :func:`create_app` take, with defaults that serve
    the simulated engine."""

    backend: Backend | None = None
    router: Router | None = None
    renderer: str | None = "harmony"
    #: Keyword options for the default route's renderer (``get_renderer(renderer, **options)``).
    renderer_options: Mapping[str, Any] = field(default_factory=dict)
    api_keys: Iterable[str] | Mapping[str, str] | None = None
    authenticator: Authenticator | None = None
    store: ResponseStore | None = None
    #: Bounds of the in-memory store made when ``store`` is ``None``: bytes of all tenants'
    #: stored responses together, and of one tenant's (least recently used go first).
    store_max_bytes: int = DEFAULT_STORE_BYTES
    store_max_tenant_bytes: int = DEFAULT_STORE_TENANT_BYTES
    billing: UsageSubmitter | None = None
    hooks: Sequence[Hook] = ()
    limits: Limits = field(default_factory=Limits)
    session: SessionConfig = field(default_factory=SessionConfig)
    metrics: Metrics | None = None
    #: Spans per turn and pipeline stage (``responses_cache.observability.otel.OpenTelemetryTracer``, or any
    #: :class:`~responses_cache.observability.tracing.Tracer`); ``None`` traces nothing.
    tracer: Tracer | None = None
    max_body_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: The process's cache memory budget: the hot cache and all WebSocket connections' caches
    #: together (least recently used give way). ``None``: per-connection caps only.
    process_cache_bytes: int | None = DEFAULT_PROCESS_CACHE_BYTES
    #: The process-wide hot cache's share of that budget (``None``: half of it, or 1 GiB without
    #: a process budget; ``0``: no hot cache). The connection caches get the rest.
    hot_cache_bytes: int | None = None
    #: Close ``store`` when the app shuts down (set by whoever hands over a store it created for
    #: the app, as ``serve`` does; a store the app creates itself is always its own).
    own_store: bool = False
    context_window: int = DEFAULT_CONTEXT_WINDOW
    #: Cap on request bytes held by unfinished requests (WebSocket frames and HTTP bodies), all
    #: connections together.
    process_input_bytes: int | None = DEFAULT_PROCESS_INPUT_BYTES
    #: A WebSocket write that waits on the peer longer aborts the connection.
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    #: Bytes of events queued for one WebSocket peer (one event always fits); beyond it the turns
    #: producing more wait for the peer to read.
    outbound_bytes: int = DEFAULT_OUTBOUND_BYTES
    #: Input bytes per second a WebSocket connection, and a tenant's connections and request bodies
    #: together, may send before the server stops reading them (``None``: no input rate limit; an
    #: :class:`~responses_cache.limits.input_rate.InputRate` is used as it is, e.g. shared by two apps).
    input_rate: InputRateLimits | InputRate | None = field(default_factory=InputRateLimits)
    #: The process-wide parsed-tools cache, in bytes.
    tool_cache_bytes: int = DEFAULT_TOOL_CACHE_BYTES
    #: Renders that tokenize at least this many characters run on a worker thread.
    offload_chars: int = 64 * 1024
    #: Worker threads for those renders (``None``: a quarter of the CPUs, at least one).
    tokenizer_threads: int | None = None
    #: Give each tenant its own engine prefix cache (``cache_salt``); ``False`` shares it.
    partition_prefix_cache: bool = True
    #: Seals ``include: ["reasoning.encrypted_content"]`` reasoning (``Sealer.from_text(key)``;
    #: the sealing extra). ``None``: that option is accepted and does nothing.
    sealer: Sealer | None = None
    #: ``truncation: "auto"`` cuts a prompt that does not fit to ``1 - truncation_headroom`` of the
    #: room it has, so the turns after it append to the cut log instead of each cutting again.
    truncation_headroom: float = 0.25
    #: How long a compaction item opens after it was made (then it is refused: compact again).
    compaction_ttl_s: float = DEFAULT_COMPACTION_TTL_S
    #: The most tokens the engine may write for a compaction's summary.
    compaction_max_output_tokens: int = DEFAULT_SUMMARY_TOKENS
    #: Finished background responses whose events are kept in memory for late stream readers.
    background_retain: int = 1024
    #: Per-tenant quotas (requests and tokens per minute, concurrent responses, connections);
    #: ``None``: none. See ``docs/limits.md``.
    quotas: QuotaConfig | None = None
    #: Where the quota counters live: ``None`` is this process
    #: (:class:`~responses_cache.limits.quotas.MemoryRateLimiter`); a
    #: :class:`~responses_cache.limits.redis_quotas.RedisRateLimiter` shares them across processes.
    rate_limiter: RateLimiter | None = None
    #: Generations running at once in this process, all tenants together; when they are taken,
    #: tenants get the freed slots round-robin (``None``: no bound here, the engine queues).
    engine_slots: int | None = None


def default_router(
    backend: Backend, renderer: str | None, context_window: int, renderer_options: Mapping[str, Any] | None = None
) -> StaticRouter:
    r = None
    if renderer:
        from ..tokens import get_renderer

        try:
            r = get_renderer(renderer, **(renderer_options or {}))
        except TypeError as exc:  # an option the renderer does not take
            raise ValueError(f"renderer_options {dict(renderer_options or {})!r} do not apply to {renderer!r}: {exc}") from None
    elif renderer_options:
        raise ValueError("renderer_options are given but no renderer")
    route = Route(name="default", model=backend.models()[0], backend=backend, renderer=r, context_window=context_window)
    return StaticRouter({m: route for m in backend.models()}, default=route)


def split_budget(process_bytes: int | None, hot_bytes: int | None) -> tuple[int, int | None]:
    """(hot cache bytes, connection caches' bytes) out of the process budget."""
    if hot_bytes is None:
        hot_bytes = process_bytes // 2 if process_bytes else 1024**3
    if process_bytes is None:
        return hot_bytes, None
    if hot_bytes >= process_bytes:
        raise ValueError("hot_cache_bytes must be less than process_cache_bytes")
    return hot_bytes, process_bytes - hot_bytes


def _configured(config: ServerConfig | None, options: Mapping[str, object], caller: str) -> ServerConfig:
    """``config`` with ``options`` applied, as a copy: the caller's config is never changed."""
    cfg = config or ServerConfig()
    unknown = sorted(set(options) - {f.name for f in fields(ServerConfig)})
    if unknown:
        raise TypeError(f"{caller}() got an unexpected option {unknown[0]!r}")
    return replace(cfg, **options)  # type: ignore[arg-type]


def create_service(config: ServerConfig | None = None, **options: object) -> Service:
    """Build a :class:`Service` to mount with :class:`WebSocketMode` in any ASGI app, or to serve
    with :func:`create_app`. Keyword options override :class:`ServerConfig` fields.

    Who may connect must be said explicitly: ``api_keys=[...]``, an ``authenticator=``, or
    ``authenticator=AllowAll()`` for development. A service does nothing until started: the host
    app's lifespan starts and closes it (through ``WebSocketMode``), or ``async with service``.
    """
    cfg = _configured(config, options, "create_service")
    if cfg.authenticator is None and not cfg.api_keys:
        raise ValueError(
            "create_service() needs api_keys=[...] or an authenticator= (AllowAll() for development): "
            "a mount without one would let every client in"
        )
    return _build(cfg, cfg.authenticator or BearerKeys(cfg.api_keys or ()))


def _build(cfg: ServerConfig, authenticator: Authenticator) -> Service:
    backend = cfg.backend or SimulatedEngine()
    router = cfg.router or default_router(backend, cfg.renderer, cfg.context_window, cfg.renderer_options)
    metrics = cfg.metrics or InMemoryMetrics()
    store = cfg.store
    if store is None:
        store = MemoryResponseStore(max_bytes=cfg.store_max_bytes, max_tenant_bytes=cfg.store_max_tenant_bytes)
    owns_store = cfg.own_store or cfg.store is None
    hot_bytes, connection_bytes = split_budget(cfg.process_cache_bytes, cfg.hot_cache_bytes)
    hot = HotCache(hot_bytes, ttl_s=getattr(store, "ttl_s", None)) if hot_bytes else None
    if isinstance(store, MemoryResponseStore) and store.evicted is None:
        store.evicted = _store_evictions(metrics, hot)
    if isinstance(cfg.billing, Biller) and cfg.billing.metrics is None:
        cfg.billing.metrics = metrics  # the billing lag, with the service's other metrics
    pipeline = Pipeline(
        store=store, hooks=HookRunner(cfg.hooks), validator=Validator(cfg.limits), billing=cfg.billing, metrics=metrics,
        offload_chars=cfg.offload_chars, tokenizer_threads=cfg.tokenizer_threads,
        partition_prefix_cache=cfg.partition_prefix_cache, truncation_headroom=cfg.truncation_headroom,
        summary_tokens=cfg.compaction_max_output_tokens, tracer=cfg.tracer,
        engine_gate=FairGate(cfg.engine_slots) if cfg.engine_slots is not None else None,
    )
    if tool_cache.max_bytes != cfg.tool_cache_bytes:
        tool_cache.resize(cfg.tool_cache_bytes)
    backends = router.backends() if isinstance(router, StaticRouter) else [backend]
    quotas = Quotas(cfg.quotas, cfg.rate_limiter) if cfg.quotas is not None else None
    core = Responder(
        router, pipeline, store, hot=hot, sealer=cfg.sealer, compaction_ttl_s=cfg.compaction_ttl_s, quotas=quotas
    )
    background = BackgroundRunner(core, retain=cfg.background_retain)
    drainer = Drain()
    background.drain = drainer
    return Service(
        core=core,
        background=background,
        authenticator=authenticator,
        session=cfg.session,
        metrics=metrics,
        max_message_bytes=cfg.max_body_bytes,
        process_cache_bytes=connection_bytes,
        input_budget=InputBudget(cfg.process_input_bytes) if cfg.process_input_bytes else None,
        write_timeout_s=cfg.write_timeout_s,
        outbound_bytes=cfg.outbound_bytes,
        input_rate=InputRate(cfg.input_rate) if isinstance(cfg.input_rate, InputRateLimits) else cfg.input_rate,
        # Started in this order, closed in reverse: billing outlives the backends and the store,
        # and the pipeline's tokenizer threads go last. A backend's start (an engine adapter's
        # tokenizer handshake) may refuse the start-up.
        # The background runner starts last (it reads the opened billing journal and listens on
        # the store) and closes first (its running responses end while the rest still works).
        drainer=drainer,
        resources=Resources([pipeline, cfg.billing, store if owns_store else None, quotas, *backends, *cfg.hooks, background]),
    )


def _store_evictions(metrics: Metrics, hot: HotCache | None) -> Callable[[Bound, str, str], None]:
    """What follows the memory store's evictions: each is counted in ``store_evictions_total``, by
    the bound that made it, and its state leaves the hot cache (which would refuse it anyway), so
    an evicted response's memory is freed unless a connection's cache still holds it."""

    def evicted(bound: Bound, tenant: str, response_id: str) -> None:
        metrics.inc("store_evictions_total", {"bound": bound})
        if hot is not None:
            hot.evict(tenant, response_id)

    return evicted


def create_app(config: ServerConfig | None = None, **options: object) -> Starlette:
    """The reference server: HTTP (JSON and SSE), WebSocket mode, ``GET /v1/models``, the health
    endpoints ``GET /healthz`` and ``GET /readyz`` and, with :class:`PrometheusMetrics`, ``/metrics``. ``create_app()`` serves the simulated engine;
    keyword options override :class:`ServerConfig` fields (``create_app(api_keys=["sk-1"])``).
    Without ``api_keys`` or an ``authenticator`` every client is let in (development)."""
    cfg = _configured(config, options, "create_app")
    service = _build(cfg, cfg.authenticator or (BearerKeys(cfg.api_keys) if cfg.api_keys else AllowAll()))
    return app_for(service)


def _lifespan(service: Service) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """The app's own lifespan runs the service too (start and close are idempotent), so the
    HTTP routes have it even where the lifespan is entered without the middleware."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with service:
            yield

    return lifespan


def prometheus_of(metrics: Metrics) -> PrometheusMetrics | None:
    """The Prometheus exporter among ``metrics`` (itself, or one a :class:`MetricsTee` feeds)."""
    if isinstance(metrics, PrometheusMetrics):
        return metrics
    if isinstance(metrics, MetricsTee):
        for target in metrics.targets:
            found = prometheus_of(target)
            if found is not None:
                return found
    return None


def health_routes(service: Service) -> list[HTTPRoute]:
    """``GET /healthz`` (liveness: the process answers) and ``GET /readyz`` (readiness:
    :meth:`Service.ready`, 503 while starting, draining or without its store). No key needed;
    the body says nothing more than the status code (docs/deploy.md)."""

    async def healthz(request: Request) -> HTTPResponse:
        return HTTPResponse(b'{"status":"ok"}', media_type="application/json", headers=_NO_STORE)

    async def readyz(request: Request) -> HTTPResponse:
        if await service.ready():
            return HTTPResponse(b'{"status":"ready"}', media_type="application/json", headers=_NO_STORE)
        return HTTPResponse(b'{"status":"unready"}', status_code=503, media_type="application/json", headers=_NO_STORE)

    return [HTTPRoute("/healthz", healthz, methods=["GET"]), HTTPRoute("/readyz", readyz, methods=["GET"])]


_NO_STORE = {"cache-control": "no-store"}


def app_for(service: Service) -> Starlette:
    """A Starlette app serving ``service`` over HTTP and WebSocket mode; the app's lifespan
    starts and closes the service."""
    api = HTTPApi(
        service.core, service.authenticator, max_body_bytes=service.max_message_bytes, input_budget=service.input_budget,
        background=service.background, input_rate=service.input_rate, drain=service.drainer,
    )
    routes = [*health_routes(service), *api.routes()]
    metrics = service.metrics
    exposition = prometheus_of(metrics)
    if exposition is not None:

        async def prometheus(request: Request) -> HTTPResponse:
            return HTTPResponse(exposition.exposition(), media_type=exposition.content_type)

        routes.append(HTTPRoute("/metrics", prometheus, methods=["GET"]))
    app = Starlette(routes=routes, lifespan=_lifespan(service))
    app.add_middleware(WebSocketMode, service=service)  # type: ignore[arg-type]
    app.state.service = service
    app.state.metrics = metrics
    return app
