"""responses-cache: WebSocket mode and connection-scoped state caching for Responses API servers.

Public API::

    from responses_cache import create_app, WebSocketMode, ServerConfig
"""

from .app import ServerConfig, create_app
from .auth import AllowAll, Authenticator, BearerKeys
from .backends import (
    Backend,
    BackendError,
    GenerationRequest,
    Scenario,
    SimulatedConfig,
    SimulatedEngine,
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
from .metrics import InMemoryMetrics, Metrics, PrometheusMetrics
from .pipeline import Hook, HookContext, HookRunner, Limits, Pipeline, Verdict
from .protocol.errors import ResponsesError
from .routing import Route, Router, StaticRouter
from .service import ResponsesService
from .session import Session, SessionConfig
from .state import ResponseState
from .store import MemoryResponseStore, ResponseStore, StoredResponse
from .websocket import WebSocketMode

__version__ = "0.1.0"

__all__ = [
    "AllowAll",
    "Authenticator",
    "Backend",
    "BackendError",
    "BearerKeys",
    "Biller",
    "BillingSink",
    "CallableSink",
    "GenerationRequest",
    "Hook",
    "HookContext",
    "HookRunner",
    "InMemoryMetrics",
    "JsonlSink",
    "Limits",
    "MemoryResponseStore",
    "Metrics",
    "Pipeline",
    "PrometheusMetrics",
    "ResponseState",
    "ResponseStore",
    "ResponsesError",
    "ResponsesService",
    "Route",
    "Router",
    "Scenario",
    "ServerConfig",
    "Session",
    "SessionConfig",
    "SimulatedConfig",
    "SimulatedEngine",
    "SqliteSink",
    "StaticRouter",
    "StoredResponse",
    "UsageRecord",
    "Verdict",
    "WebSocketMode",
    "WebhookSink",
    "__version__",
    "create_app",
]
