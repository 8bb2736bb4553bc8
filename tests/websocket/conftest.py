"""Fixtures of the WebSocket suite: a recording backend and a live server serving it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from backends import RecordingBackend
from wsclient import RENDERER


@pytest.fixture
def backend() -> RecordingBackend:
    return RecordingBackend()


@pytest.fixture
def serve(responses_cache_server_factory: Callable[..., Any], backend: RecordingBackend) -> Callable[..., Any]:
    """``serve(**create_app options)``: a live server over the recording backend (by default)."""

    def factory(**options: Any) -> Any:
        options.setdefault("backend", backend)
        options.setdefault("renderer", RENDERER)
        return responses_cache_server_factory(**options)

    return factory
