"""Shared fixtures: a live uvicorn server on a free loopback port, and app factories."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn

from responses_cache import SimulatedConfig, SimulatedEngine, create_app


@dataclass
class LiveServer:
    app: Any
    host: str
    port: int

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/responses"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(app: Any) -> tuple[LiveServer, Callable[[], None]]:
    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws_max_size=16 * 1024 * 1024, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(10)

    return LiveServer(app, "127.0.0.1", port), stop


@pytest.fixture
def live_server_factory() -> Iterator[Callable[..., LiveServer]]:
    """``live_server_factory(**create_app_options)`` → a running server (stopped at teardown)."""
    stops: list[Callable[[], None]] = []

    def factory(app: Any = None, **options: Any) -> LiveServer:
        if app is None:
            options.setdefault("backend", SimulatedEngine(SimulatedConfig(instant=True)))
            app = create_app(**options)
        server, stop = start_server(app)
        stops.append(stop)
        return server

    yield factory
    for stop in stops:
        stop()


@pytest.fixture
def live_server(live_server_factory: Callable[..., LiveServer]) -> LiveServer:
    return live_server_factory()
