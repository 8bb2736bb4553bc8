"""responses-cache: WebSocket mode and connection-scoped state caching for Responses API servers.

The public API is what this module exports (``__all__``); everything else is internal and may
change. In short::

    from responses_cache import create_app                       # the reference server
    from responses_cache import WebSocketMode, create_service    # native mode in your own app
    app.add_middleware(WebSocketMode, service=create_service(backend=my_backend, api_keys=[...]))

See ``docs/api.md`` for each name with an example. The names are imported on first use (PEP 562),
so importing a part of the package (``responses_cache.tokens``…) loads only what that part needs.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backends import (
        Backend,
        BackendError,
        BackendEvent,
        EngineUsage,
        Finish,
        GenerationRequest,
        Prompt,
        ReasoningDelta,
        Scenario,
        SimulatedConfig,
        SimulatedEngine,
        TextDelta,
        ToolCallDelta,
        ToolCallStart,
        load_backend,
    )
    from .backends.routing import Route, Router, StaticRouter
    from .billing import (
        Biller,
        BillingSink,
        CallableSink,
        JsonlSink,
        SqliteSink,
        UsageRecord,
        WebhookSink,
    )
    from .core.auth import AllowAll, Authenticator, BearerKeys
    from .core.runtime import Service
    from .edge.app import ServerConfig, create_app, create_service
    from .edge.host import HostScope
    from .edge.websocket import WebSocketMode
    from .limits.input_rate import InputRateLimits
    from .limits.quotas import MemoryRateLimiter, Quota, QuotaConfig, RateLimiter
    from .observability.metrics import InMemoryMetrics, Metrics, MetricsTee, PrometheusMetrics
    from .observability.tracing import Tracer
    from .pipeline import Hook, HookContext, Limits, Verdict
    from .protocol.errors import ResponsesError
    from .session.session import SessionConfig
    from .storage.store import MemoryResponseStore, ResponseStore, StoredResponse
    from .tokens import Renderer, get_renderer

__version__ = "0.1.0"

__all__ = [
    "AllowAll",
    "Authenticator",
    "Backend",
    "BackendError",
    "BackendEvent",
    "BearerKeys",
    "Biller",
    "BillingSink",
    "CallableSink",
    "EngineUsage",
    "Finish",
    "GenerationRequest",
    "Hook",
    "HookContext",
    "HostScope",
    "InMemoryMetrics",
    "InputRateLimits",
    "JsonlSink",
    "Limits",
    "MemoryRateLimiter",
    "MemoryResponseStore",
    "Metrics",
    "MetricsTee",
    "PrometheusMetrics",
    "Prompt",
    "Quota",
    "QuotaConfig",
    "RateLimiter",
    "ReasoningDelta",
    "Renderer",
    "ResponseStore",
    "ResponsesError",
    "Route",
    "Router",
    "Scenario",
    "ServerConfig",
    "Service",
    "SessionConfig",
    "SimulatedConfig",
    "SimulatedEngine",
    "SqliteSink",
    "StaticRouter",
    "StoredResponse",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallStart",
    "Tracer",
    "UsageRecord",
    "Verdict",
    "WebSocketMode",
    "WebhookSink",
    "__version__",
    "create_app",
    "create_service",
    "get_renderer",
    "load_backend",
]

#: Where each public name is defined (a module of this package). A name is imported on first
#: use, so ``import responses_cache.tokens`` (or any other part of the sans-I/O core) does not
#: import the ASGI edge, Starlette with it.
_PUBLIC: dict[str, str] = {
    "AllowAll": "core.auth",
    "Authenticator": "core.auth",
    "Backend": "backends",
    "BackendError": "backends",
    "BackendEvent": "backends",
    "BearerKeys": "core.auth",
    "Biller": "billing",
    "BillingSink": "billing",
    "CallableSink": "billing",
    "EngineUsage": "backends",
    "Finish": "backends",
    "GenerationRequest": "backends",
    "Hook": "pipeline",
    "HookContext": "pipeline",
    "HostScope": "edge.host",
    "InMemoryMetrics": "observability.metrics",
    "InputRateLimits": "limits.input_rate",
    "JsonlSink": "billing",
    "Limits": "pipeline",
    "MemoryRateLimiter": "limits.quotas",
    "MemoryResponseStore": "storage.store",
    "Metrics": "observability.metrics",
    "MetricsTee": "observability.metrics",
    "PrometheusMetrics": "observability.metrics",
    "Prompt": "backends",
    "Quota": "limits.quotas",
    "QuotaConfig": "limits.quotas",
    "RateLimiter": "limits.quotas",
    "ReasoningDelta": "backends",
    "Renderer": "tokens",
    "ResponseStore": "storage.store",
    "ResponsesError": "protocol.errors",
    "Route": "backends.routing",
    "Router": "backends.routing",
    "Scenario": "backends",
    "ServerConfig": "edge.app",
    "Service": "core.runtime",
    "SessionConfig": "session.session",
    "SimulatedConfig": "backends",
    "SimulatedEngine": "backends",
    "SqliteSink": "billing",
    "StaticRouter": "backends.routing",
    "StoredResponse": "storage.store",
    "TextDelta": "backends",
    "ToolCallDelta": "backends",
    "ToolCallStart": "backends",
    "Tracer": "observability.tracing",
    "UsageRecord": "billing",
    "Verdict": "pipeline",
    "WebSocketMode": "edge.websocket",
    "WebhookSink": "billing",
    "create_app": "edge.app",
    "create_service": "edge.app",
    "get_renderer": "tokens",
    "load_backend": "backends",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
