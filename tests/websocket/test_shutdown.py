"""A server that shuts down while a connection is cleaning up (the peer left, its turns are being
cancelled): the cancellation reaches the application as the server's own, so a cancel scope
around it (anyio's, as in Starlette's TestClient and anyio-based servers) recognises and absorbs
it, and the connection's state is still freed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from responses_cache import create_service
from responses_cache.backends.base import BackendEvent, GenerationRequest, TextDelta
from responses_cache.core.auth import AllowAll
from responses_cache.edge.app import app_for
from responses_cache.edge.websocket import WebSocketMode
from responses_cache.session.session import SessionConfig

SCOPE: dict[str, Any] = {
    "type": "websocket", "path": "/v1/responses", "root_path": "", "headers": [], "query_string": b"",
    "scheme": "ws", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "subprotocols": [],
    "asgi": {"version": "3.0"},
}
SHUTDOWN = "the server is shutting down"


class ShutdownWhileClosing:
    """Streams until closed; closing it (the turn's cancellation after the peer left) is the moment
    the server cancels the application, before the connection's other tasks have run."""

    accepts_media = False

    def __init__(self) -> None:
        self.app_task: asyncio.Task[None] | None = None
        self.open = 0

    def models(self) -> list[str]:
        return ["sim-1"]

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self.open += 1
        try:
            while True:
                await asyncio.sleep(0)
                yield TextDelta("x ")
        finally:
            self.open -= 1
            assert self.app_task is not None
            self.app_task.cancel(SHUTDOWN)


class Peer:
    """Sends one turn; at its first event, either leaves or (still connected) sees the server
    begin to stop."""

    def __init__(self, leaves: bool, backend: ShutdownWhileClosing) -> None:
        self.leaves, self.backend = leaves, backend
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inbox.put_nowait({"type": "websocket.connect"})
        create = {"type": "response.create", "model": "sim-1", "input": "hi"}
        self.inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(create)})

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] != "websocket.send":
            return
        if self.leaves:
            self.inbox.put_nowait({"type": "websocket.disconnect", "code": 1001})
        elif self.backend.app_task is not None:
            self.backend.app_task.cancel(SHUTDOWN)


@pytest.mark.parametrize("leaves", [True, False], ids=["peer-left", "peer-connected"])
async def test_a_shutdown_during_cleanup_reaches_the_app_as_its_own_and_frees_the_state(leaves: bool) -> None:
    backend = ShutdownWhileClosing()
    service = create_service(backend=backend, renderer=None, authenticator=AllowAll(), session=SessionConfig(),
                             process_input_bytes=1024 * 1024)
    mode = WebSocketMode(app_for(service), service)
    peer = Peer(leaves, backend)
    task = backend.app_task = asyncio.ensure_future(mode(dict(SCOPE), peer.receive, peer.send))  # type: ignore[arg-type]
    done, _ = await asyncio.wait([task], timeout=60)  # a safety net only; nothing is timed
    assert done and task.cancelled()
    # The cancellation carries the server's message: a cancel scope can tell it is its own.
    # (Routed through ``asyncio.gather``, it arrived as the turn's own, message-less one.)
    try:
        task.result()
    except asyncio.CancelledError as exc:
        assert exc.args == (SHUTDOWN,)
    assert mode.connections == 0 and backend.open == 0
    assert mode.input_budget is not None and mode.input_budget.held == 0
    await asyncio.sleep(0)
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert leftover == []  # the writer, the watchdog and the lifetime timer are gone
