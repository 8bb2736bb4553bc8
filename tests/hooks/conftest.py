"""Fixtures of the hooks suite: the testing kit's pytest plugin (until it is enabled by its entry point)."""

from __future__ import annotations

from responses_cache.pytest_plugin import hook_checker, recording_backend, scripted_backend

__all__ = ["hook_checker", "recording_backend", "scripted_backend"]
