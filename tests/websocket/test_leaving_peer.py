"""A client that leaves mid-stream stops the engine: the backend's stream is closed to the end.

Closing the backend's stream is what aborts the engine's request (the vLLM adapter closes its HTTP
stream). That close awaits, and a second cancellation landing inside it cut it short: the HTTP
client marked the stream closed without closing its connection, and the engine went on generating
the whole request for nobody (against a real vLLM: 6 of 32 aborts lost). These tests drive the
connection in-process through ASGI with a peer that leaves the way uvicorn reports it (a write
fails once the close frame has arrived, then the reader gets the disconnect), and check how the
backend's stream ended by counting: nothing is timed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest

from responses_cache import create_service
from responses_cache.backends.base import BackendEvent, GenerationRequest, TextDelta
from responses_cache.core.auth import AllowAll
from responses_cache.edge.app import app_for
from responses_cache.edge.websocket import WebSocketMode

SCOPE: dict[str, Any] = {
    "type": "websocket", "path": "/v1/responses", "root_path": "", "headers": [], "query_string": b"",
    "scheme": "ws", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "subprotocols": [],
    "asgi": {"version": "3.0"},
}

#: Loop turns the backend's close takes (an HTTP client's lock, then the socket's close).
CLOSE_STEPS = 4


class FastEngine:
    """Streams deltas as fast as it is read; each read yields to the loop once, the way a
    socket read with data already buffered does. Closing it takes :data:`CLOSE_STEPS` turns of
    the loop; ``closed`` counts the closes that ran to the end, ``interrupted`` those cut short."""

    accepts_media = False

    def __init__(self) -> None:
        self.deltas = 0
        self.closed = 0
        self.interrupted = 0

    def models(self) -> Sequence[str]:
        return ["fast-1"]

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        try:
            while True:
                await asyncio.sleep(0)  # the read: data is ready, the loop runs once
                self.deltas += 1
                yield TextDelta("x ")
        finally:
            try:
                for _ in range(CLOSE_STEPS):
                    await asyncio.sleep(0)  # the close's own I/O, not a wait on anything
            except asyncio.CancelledError:
                self.interrupted += 1
                raise
            self.closed += 1


class LeavingPeer:
    """Reads ``leave_after`` text deltas, then leaves as uvicorn reports it: once the close frame
    has arrived, every write fails, and the reader's next receive is the disconnect."""

    def __init__(self, frame: str, leave_after: int) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inbox.put_nowait({"type": "websocket.connect"})
        self.inbox.put_nowait({"type": "websocket.receive", "text": frame})
        self.leave_after = leave_after
        self.deltas = 0
        self.gone = False

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] != "websocket.send":
            return
        if self.deltas == self.leave_after:
            # The close frame arrived before this write: uvicorn queues the disconnect for the
            # reader and fails the write (ClientDisconnected).
            if not self.gone:
                self.gone = True
                self.inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
            raise OSError("the client closed the connection")
        if json.loads(message["text"])["type"] == "response.output_text.delta":
            self.deltas += 1


@pytest.mark.parametrize("leave_after", [1, 5, 64, 65])
async def test_a_client_leaving_mid_stream_closes_the_backends_stream_to_the_end(leave_after: int) -> None:
    engine = FastEngine()
    service = create_service(backend=engine, renderer=None, authenticator=AllowAll())
    mode = WebSocketMode(app_for(service), service)
    peer = LeavingPeer(json.dumps({"type": "response.create", "model": "fast-1", "input": "Go on."}), leave_after)
    # The safety net only keeps a broken build from hanging the suite; nothing is timed.
    await asyncio.wait_for(mode(dict(SCOPE), peer.receive, peer.send), 60)  # type: ignore[arg-type]
    assert mode.connections == 0
    # The turn was cancelled once: its close of the engine's stream ran to the end.
    assert (engine.closed, engine.interrupted) == (1, 0)
    # And it stopped at once: the delta whose write failed, and none after it.
    assert engine.deltas == leave_after + 1
