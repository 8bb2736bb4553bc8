"""Input rate limits at the ASGI edge, on a logical clock: a flooding WebSocket client's frames, and
a request body's chunks, are asked of the server no faster than the budget allows. The server
stops reading a socket while a received message waits for the app (uvicorn's WebSocket
implementation; its HTTP body buffer), so what is not asked for is not read from the socket.

Counted, not timed: the peer hands over a frame whenever it is asked, and each ask is checked
against the bytes the budget allows by the logical time of the ask."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from responses_cache import (
    InputRateLimits,
    SimulatedConfig,
    SimulatedEngine,
    create_app,
    create_service,
)
from responses_cache.core.auth import AllowAll, BearerKeys
from responses_cache.edge.app import app_for
from responses_cache.edge.websocket import WebSocketMode
from responses_cache.limits.input_rate import InputRate
from responses_cache.testing import LogicalClock

MIB = 1024 * 1024
SCOPE: dict[str, Any] = {
    "type": "websocket", "path": "/v1/responses", "root_path": "", "query_string": b"",
    "scheme": "ws", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "subprotocols": [],
    "asgi": {"version": "3.0"},
}



class FloodingPeer:
    """Hands over ``count`` frames of ``size`` bytes as fast as it is asked, recording the logical
    time of each ask, then disconnects; takes every event it is sent at once."""

    def __init__(self, clock: LogicalClock, size: int, count: int) -> None:
        pad = "x" * (size - len(json.dumps({"type": "response.nonesuch", "pad": ""})))
        self.frame = json.dumps({"type": "response.nonesuch", "pad": pad})
        assert len(self.frame) == size
        self.clock = clock
        self.left = count
        self.asks: list[float] = []
        self.errors = 0
        self.connected = False

    async def receive(self) -> dict[str, Any]:
        if not self.connected:
            self.connected = True
            return {"type": "websocket.connect"}
        if self.left == 0:
            return {"type": "websocket.disconnect", "code": 1000}
        self.asks.append(self.clock.now)
        self.left -= 1
        return {"type": "websocket.receive", "text": self.frame}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "websocket.send":
            self.errors += json.loads(message["text"])["type"] == "error"


def _check_asks(asks: list[float], size: int, rate: float, burst: int) -> None:
    """Before the ``k``-th ask, ``k`` frames were taken: at most the burst, the rate over the time
    so far, and the one frame that put the budget in debt."""
    for k, at in enumerate(asks):
        assert k * size <= burst + rate * at + size, f"frame {k} asked for at t={at:.3f}s"


async def test_a_flooding_websocket_client_is_read_no_faster_than_its_budget() -> None:
    clock = LogicalClock()
    limits = InputRateLimits(connection_bytes_per_s=MIB, connection_burst_bytes=MIB // 4, tenant_bytes_per_s=None)
    service = create_service(authenticator=AllowAll(), input_rate=InputRate(limits, clock=clock, sleep=clock.sleep))
    mode = WebSocketMode(app_for(service), service)
    size, count = 50_000, 100  # 5 MB at 1 MiB/s: about 4.5 logical seconds
    peer = FloodingPeer(clock, size, count)
    await asyncio.wait_for(mode(dict(SCOPE, headers=[]), peer.receive, peer.send), 60)  # type: ignore[arg-type]
    assert len(peer.asks) == count and peer.errors == count  # every frame was decoded and answered
    _check_asks(peer.asks, size, MIB, MIB // 4)
    # ...and the budget was all there was to wait for (a client keeping to it is not starved).
    assert clock.now <= (count * size - MIB // 4) / MIB + 0.1


async def test_a_tenants_connections_and_request_bodies_share_its_budget() -> None:
    clock = LogicalClock()
    limits = InputRateLimits(connection_bytes_per_s=None, tenant_bytes_per_s=MIB, tenant_burst_bytes=2 * MIB)
    rate = InputRate(limits, clock=clock, sleep=clock.sleep)
    app = create_app(
        backend=SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=2)), api_keys={"sk-a": "a", "sk-b": "b"},
        input_rate=rate,
    )
    mode = next(m for m in _middlewares(app) if isinstance(m, WebSocketMode))
    assert isinstance(mode.service.authenticator, BearerKeys)
    size, count = 50_000, 60
    peer = FloodingPeer(clock, size, count)
    headers = [(b"authorization", b"Bearer sk-a")]
    await asyncio.wait_for(mode(dict(SCOPE, headers=headers), peer.receive, peer.send), 60)  # type: ignore[arg-type]
    _check_asks(peer.asks, size, MIB, 2 * MIB)
    # Tenant a is in debt now: its request body is asked for only as its budget refills, chunk by
    # chunk; tenant b's is taken at once.
    # (1.5 MiB of one letter: read in full, then refused as context_length_exceeded.)
    body = json.dumps({"model": "sim-1", "input": "y" * (3 * MIB // 2)}).encode()
    chunks = [body[i : i + 100_000] for i in range(0, len(body), 100_000)]

    async def post(key: str) -> tuple[int, list[float]]:
        asks: list[float] = []
        left = list(chunks)

        async def receive() -> dict[str, Any]:
            if not left:
                await asyncio.Event().wait()  # no disconnect while the response is written
            asks.append(clock.now)
            chunk = left.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(left)}

        status: list[int] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        scope = {
            "type": "http", "method": "POST", "path": "/v1/responses", "root_path": "", "query_string": b"",
            "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")],
            "scheme": "http", "server": ("t", 80), "client": ("127.0.0.1", 1), "asgi": {"version": "3.0"},
            "http_version": "1.1",
        }
        await asyncio.wait_for(app(scope, receive, send), 60)
        return status[0], asks

    started = clock.now
    b_status, b_asks = await post("sk-b")
    assert b_status == 400 and b_asks == [started] * len(chunks)  # another tenant: not slowed at all
    a_status, a_asks = await post("sk-a")
    assert a_status == 400 and a_asks[-1] > started
    for k, at in enumerate(a_asks):
        taken = count * size + k * 100_000  # the frames before, then the chunks taken so far
        assert taken <= 2 * MIB + MIB * at + 100_000, f"chunk {k} asked for at t={at:.3f}s"


def _middlewares(app: Any) -> list[Any]:
    found: list[Any] = []
    node = app.build_middleware_stack()
    while node is not None:
        found.append(node)
        node = getattr(node, "app", None)
    return found
