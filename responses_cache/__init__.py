"""responses-cache: WebSocket mode and connection-scoped state caching for Responses API servers.

Public API::

    from responses_cache import create_app, WebSocketMode, ServerConfig
"""

from .app import ServerConfig, create_app
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
from .metrics import InMemoryMetrics, Metrics, PrometheusMetrics
from .pipeline import Hook, HookContext, HookRunner, Limits, Pipeline, Verdict
from .protocol.errors import ResponsesError
from .routing import Route, Router, StaticRouter
from .service import ResponsesService
from .session import Session, SessionConfig
from .state import ResponseState
from .store import MemoryResponseStore, ResponseStore, StoredResponse
from .tokens import get_renderer
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
    "HookRunner",
    "InMemoryMetrics",
    "JsonlSink",
    "Limits",
    "MemoryResponseStore",
    "Metrics",
    "Pipeline",
    "PrometheusMetrics",
    "Prompt",
    "ReasoningDelta",
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
    "TextDelta",
    "ToolCallDelta",
    "ToolCallStart",
    "UsageRecord",
    "Verdict",
    "WebSocketMode",
    "WebhookSink",
    "__version__",
    "create_app",
    "get_renderer",
    "load_backend",
]
