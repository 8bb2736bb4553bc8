"""A frame that arrives while a turn relays a burst of engine output is taken during the burst.

An engine's output can be there all at once: an HTTP stream with many SSE lines already
buffered, vLLM's output collector holding a backlog, an in-process queue. Relaying it, every
``await`` of the turn completes at once (the read, and a write into free socket buffers), so
the turn never suspends by itself, and the connection's reader, which takes the client's next
frame, runs only when the turn yields. The turn yields every
:data:`~responses_cache.edge.websocket.YIELD_EVERY` frames it writes; without that, a steer sent
mid-burst would be taken only after the whole burst (against a real engine: after the greedy
target had written all its tokens, with nothing left to abort).

The connection is driven in-process through ASGI; the steer frame is waiting for the reader
before the burst begins, and what is checked is how many deltas the burst got out: nothing is
timed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from responses_cache import create_service
from responses_cache.backends.base import BackendEvent, GenerationRequest, TextDelta
from responses_cache.core.auth import AllowAll
from responses_cache.edge.app import app_for
from responses_cache.edge.websocket import YIELD_EVERY, WebSocketMode

SCOPE: dict[str, Any] = {
    "type": "websocket", "path": "/v1/responses", "root_path": "", "headers": [], "query_string": b"",
    "scheme": "ws", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "subprotocols": [],
    "asgi": {"version": "3.0"},
}

#: Deltas the engine has buffered once its output arrives: far more than the turn relays
#: between two yields.
BURST = 20 * YIELD_EVERY
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


class BurstEngine:
    """The first generation writes one delta, then waits for its output (:attr:`arrived`), which
    is then there all at once: :data:`BURST` deltas read without suspending. Later generations
    (the steered target's successor) write one delta. ``burst`` counts the burst's deltas read."""

    accepts_media = False

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.burst = 0
        self.calls = 0

    def models(self) -> Sequence[str]:
        return ["burst-1"]

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self.calls += 1
        yield TextDelta("first ")
        if self.calls > 1:
            return
        await self.arrived.wait()
        for _ in range(BURST):
            self.burst += 1
            yield TextDelta("x ")  # buffered: no await between two deltas


class SteeringPeer:
    """Sends a create; at the target's first delta the engine's burst arrives and so does the
    client's steer frame, both at once (the burst first: the turn is woken before the reader).
    Leaves once the steer is answered and the responses on the connection have ended."""

    def __init__(self, engine: BurstEngine) -> None:
        self.engine = engine
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inbox.put_nowait({"type": "websocket.connect"})
        create = {"type": "response.create", "model": "burst-1", "input": "Go on."}
        self.inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(create)})
        self.events: list[dict[str, Any]] = []
        self.target = ""

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] != "websocket.send":
            return
        event = json.loads(message["text"])
        self.events.append(event)
        kind = event["type"]
        if kind == "response.created" and not self.target:
            self.target = event["response"]["id"]
        elif kind == "response.output_text.delta" and not self.engine.arrived.is_set():
            self.engine.arrived.set()
            steer = {"type": "response.steer", "previous_response_id": self.target, "input": "Stop. Be brief."}
            self.inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(steer)})
        ended = sum(e["type"] in TERMINAL for e in self.events)
        answered = any(e["type"].startswith("response.steer.") for e in self.events)
        if answered and ended == (2 if kind != "response.steer.failed" and self.steered() else 1):
            self.inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})

    def steered(self) -> bool:
        return any(e["type"] == "response.steer.accepted" for e in self.events)

    def ends(self) -> dict[str, dict[str, Any]]:
        return {e["response"]["id"]: e["response"] for e in self.events if e["type"] in TERMINAL}


async def test_a_steer_sent_during_a_buffered_burst_is_taken_before_the_burst_ends() -> None:
    engine = BurstEngine()
    service = create_service(backend=engine, renderer=None, authenticator=AllowAll())
    mode = WebSocketMode(app_for(service), service)
    peer = SteeringPeer(engine)
    # The safety net only keeps a broken build from hanging the suite; nothing is timed.
    await asyncio.wait_for(mode(dict(SCOPE), peer.receive, peer.send), 60)  # type: ignore[arg-type]
    assert peer.steered(), [e["type"] for e in peer.events if not e["type"].endswith(".delta")]
    target = peer.ends()[peer.target]
    assert target["status"] == "incomplete" and target["incomplete_details"] == {"reason": "steered"}
    # The reader took the frame at the turn's first yield: the burst was cut there.
    assert engine.burst <= YIELD_EVERY, engine.burst
    # And the successor ran.
    assert engine.calls == 2 and len(peer.ends()) == 2
