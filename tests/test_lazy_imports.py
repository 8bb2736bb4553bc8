"""The sans-I/O core imports without the ASGI edge: the package root loads its names on first use.

Each check runs in a fresh interpreter, since this one has long imported everything."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import responses_cache

#: The parts of the package that must import without Starlette or a server.
CORE = [
    "responses_cache.protocol",
    "responses_cache.engine_events",
    "responses_cache.tokens",
    "responses_cache.backends",
    "responses_cache.backends.routing",
    "responses_cache.conversation",
    "responses_cache.conversation.compaction",
    "responses_cache.storage.state",
    "responses_cache.storage.store",
    "responses_cache.storage.references",
    "responses_cache.storage.listing",
    "responses_cache.storage.hot",
    "responses_cache.limits.quotas",
    "responses_cache.limits.fairness",
    "responses_cache.limits.input_rate",
    "responses_cache.observability.metrics",
    "responses_cache.observability.tracing",
    "responses_cache.billing",
    "responses_cache.pipeline",
    "responses_cache.session.session",
    "responses_cache.session.steering",
    "responses_cache.session.budget",
    "responses_cache.core.responder",
    "responses_cache.core.background",
    "responses_cache.core.runtime",
    "responses_cache.core.lifecycle",
    "responses_cache.core.auth",
    "responses_cache.backends.engines",
    "responses_cache.safety",
]


def _loaded_after(modules: list[str]) -> set[str]:
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    return set(result.stdout.split())


@pytest.mark.subprocess
def test_importing_the_tokens_package_loads_neither_starlette_nor_the_edge() -> None:
    loaded = _loaded_after(["responses_cache.tokens"])
    assert "starlette" not in loaded
    assert not {m for m in loaded if m.startswith("responses_cache.") and "websocket" in m}


@pytest.mark.subprocess
def test_the_whole_core_imports_without_starlette_or_uvicorn() -> None:
    loaded = _loaded_after(CORE)
    assert "starlette" not in loaded
    assert "uvicorn" not in loaded


@pytest.mark.subprocess
def test_the_root_still_gives_every_public_name() -> None:
    code = "import responses_cache as r; assert all(getattr(r, n) is not None for n in r.__all__); assert set(r.__all__) <= set(dir(r))"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


#: The documented import paths of moved modules, and where the modules are now.
REEXPORTS = {
    "engines": "backends.engines",
    "engine_http": "backends.http",
    "ids": "protocol.ids",
    "logs": "observability.logs",
    "otel": "observability.otel",
    "quotas": "limits.quotas",
    "redis_quotas": "limits.redis_quotas",
    "redis_store": "storage.redis_store",
    "sealing": "conversation.sealing",
    "tracing": "observability.tracing",
}


@pytest.mark.parametrize("old", sorted(REEXPORTS))
def test_documented_paths_re_export_the_moved_modules(old: str) -> None:
    shim = importlib.import_module(f"responses_cache.{old}")
    real = importlib.import_module(f"responses_cache.{REEXPORTS[old]}")
    assert shim.__all__
    for name in shim.__all__:
        assert getattr(shim, name) is getattr(real, name)


def test_the_turn_runner_is_not_public() -> None:
    assert "Responder" not in responses_cache.__all__
    assert not hasattr(responses_cache, "Responder")
