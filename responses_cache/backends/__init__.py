"""Inference backends: the protocol, the embedded simulated engine, and entry-point discovery."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from .base import (
    Backend,
    BackendError,
    BackendEvent,
    EngineUsage,
    Finish,
    GenerationRequest,
    Prompt,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from .simulated import Scenario, SimulatedConfig, SimulatedEngine

ENTRY_POINT_GROUP = "responses_cache.backends"


def load_backend(name: str, **options: Any) -> Backend:
    """Build a backend by name: ``simulated``, or an adapter registered under the
    ``responses_cache.backends`` entry-point group (e.g. ``vllm``, ``cerebras``)."""
    if name == "simulated":
        return SimulatedEngine(SimulatedConfig(**options))
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            factory = ep.load()
            backend: Backend = factory(**options)
            return backend
    known = ["simulated", *sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))]
    raise LookupError(f"unknown backend {name!r}; installed: {', '.join(known)}")


__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendError",
    "BackendEvent",
    "EngineUsage",
    "Finish",
    "GenerationRequest",
    "Prompt",
    "ReasoningDelta",
    "Scenario",
    "SimulatedConfig",
    "SimulatedEngine",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallStart",
    "load_backend",
]
