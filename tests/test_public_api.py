"""The public surface: what ``responses_cache`` exports, and that internals stay out of it."""

from __future__ import annotations

import dataclasses

import pytest

import responses_cache
from responses_cache import ServerConfig, SimulatedEngine, create_app, create_service

PUBLIC = {
    # serving and mounting
    "create_app", "create_service", "ServerConfig", "Service", "WebSocketMode", "SessionConfig", "Limits",
    # who may connect
    "Authenticator", "AllowAll", "BearerKeys",
    # backends and their types
    "Backend", "BackendError", "BackendEvent", "GenerationRequest", "Prompt", "TextDelta", "ReasoningDelta",
    "ToolCallStart", "ToolCallDelta", "Finish", "EngineUsage", "SimulatedEngine", "SimulatedConfig", "Scenario",
    "load_backend",
    # routing, tokenization, hooks, errors
    "Router", "Route", "StaticRouter", "Renderer", "get_renderer", "Hook", "HookContext", "Verdict", "ResponsesError",
    # billing, store, metrics
    "Biller", "BillingSink", "CallableSink", "JsonlSink", "SqliteSink", "WebhookSink", "UsageRecord",
    "ResponseStore", "MemoryResponseStore", "StoredResponse", "Metrics", "InMemoryMetrics", "PrometheusMetrics",
    "__version__",
}


def test_all_is_exactly_the_public_surface() -> None:
    assert set(responses_cache.__all__) == PUBLIC
    for name in responses_cache.__all__:
        assert getattr(responses_cache, name) is not None


@pytest.mark.parametrize("internal", ["Session", "Pipeline", "HookRunner", "ResponsesService", "ResponseState"])
def test_internals_are_not_exported(internal: str) -> None:
    assert internal not in responses_cache.__all__
    assert not hasattr(responses_cache, internal)


def test_factories_do_not_mutate_the_config_they_are_given() -> None:
    config = ServerConfig(api_keys=["sk-1"])
    before = dataclasses.asdict(config)
    create_app(config, backend=SimulatedEngine(), context_window=4096)
    create_service(config, max_body_bytes=1024)
    assert dataclasses.asdict(config) == before


def test_unknown_options_are_refused() -> None:
    with pytest.raises(TypeError, match="max_body"):
        create_app(max_body=1)
