"""The public surface: what ``responses_cache`` exports, and that internals stay out of it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import responses_cache
from responses_cache import ServerConfig, SimulatedEngine, create_app, create_service

PUBLIC = {
    # serving and mounting
    "create_app", "create_service", "ServerConfig", "Service", "WebSocketMode", "SessionConfig", "Limits",
    "HostScope", "InputRateLimits",
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
    "MetricsTee", "Tracer",
    # per-tenant quotas
    "Quota", "QuotaConfig", "RateLimiter", "MemoryRateLimiter",
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


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_wheel_holds_the_package_and_nothing_else(tmp_path: Path) -> None:
    """What users install: the package with its type marker and vocabularies, no benchmark suite
    or profiling code, and a core that needs no server (``uvicorn`` only with the server extra)."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(root)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("responses_cache-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"responses_cache"}
    assert "responses_cache/py.typed" in names
    assert any(n.startswith("responses_cache/vocab/") and n.endswith(".gz") for n in names)
    assert not [n for n in names if "bench" in n or "profil" in n]
    core = [r for r in requires if "extra ==" not in r]
    assert sorted(r.split()[1].split(">")[0].split("[")[0] for r in core) == [
        "anyio", "cachetools", "msgspec", "starlette", "tiktoken", "tomli",  # anyio: starlette's own
    ]
    assert any("uvicorn" in r and 'extra == "server"' in r for r in requires)
