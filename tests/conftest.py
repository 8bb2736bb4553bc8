"""Shared fixtures: a live uvicorn server on a free loopback port, built from create_app options."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from responses_cache import SimulatedConfig, SimulatedEngine, create_app
from responses_cache.testing import LiveServer, serve_in_thread


@pytest.fixture
def live_server_factory() -> Iterator[Callable[..., LiveServer]]:
    """``live_server_factory(app)`` or ``live_server_factory(**create_app_options)`` → a running
    server (stopped at teardown). The default engine is the instant simulated engine."""
    servers: list[LiveServer] = []

    def factory(app: Any = None, **options: Any) -> LiveServer:
        if app is None:
            options.setdefault("backend", SimulatedEngine(SimulatedConfig(instant=True)))
            app = create_app(**options)
        server = serve_in_thread(app)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.stop()


@pytest.fixture
def live_server(live_server_factory: Callable[..., LiveServer]) -> LiveServer:
    return live_server_factory()
