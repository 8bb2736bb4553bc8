"""responses-cache: WebSocket mode and connection-scoped state caching for Responses API servers.

The public API is what this module exports (``__all__``); everything else is internal and may
change. In short::

    from responses_cache import create_app                       # the reference server
    from responses_cache import WebSocketMode, create_service    # native mode in your own app
    app.add_middleware(WebSocketMode, service=create_service(backend=my_backend, api_keys=[...]))

See ``docs/api.md`` for each name with an example.
"""

from .app import ServerConfig, create_app, create_service
from .auth import AllowAll, Authenticator, BearerKeys
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
from .billing import (
    Biller,
    BillingSink,
    CallableSink,
    JsonlSink,
    SqliteSink,
    UsageRecord,
    WebhookSink,
)
from .host import HostScope
from .input_rate import InputRateLimits
from .metrics import InMemoryMetrics, Metrics, MetricsTee, PrometheusMetrics
from .pipeline import Hook, HookContext, Limits, Verdict
from .protocol.errors import ResponsesError
from .quotas import MemoryRateLimiter, Quota, QuotaConfig, RateLimiter
from .routing import Route, Router, StaticRouter
from .runtime import Service
from .session import SessionConfig
from .store import MemoryResponseStore, ResponseStore, StoredResponse
from .tokens import Renderer, get_renderer
from .tracing import Tracer
from .websocket import WebSocketMode

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
