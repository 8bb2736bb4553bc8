"""A client disconnect while an ``alongside`` hook runs: the turn is billed ``cancelled``, the
backend's generator is closed (the engine is told to stop) and nothing raises
``aclose(): asynchronous generator is already running``."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from responses_cache import create_app
from responses_cache.billing.record import UsageRecord
from responses_cache.pipeline.hooks import HookContext, Verdict
from responses_cache.protocol.items import Item
from responses_cache.testing import EndlessBackend


class Watching:
    """An alongside hook that is still checking when the client leaves."""

    name = "watching"
    phase = "alongside"

    def __init__(self) -> None:
        self.cancelled = 0

    async def __call__(self, ctx: HookContext, new_items: Sequence[Item], state: Any) -> Verdict:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return Verdict()


class Records:
    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def submit(self, record: UsageRecord) -> None:
        self.records.append(record)


class LeavingPeer:
    """Sends one create, then disconnects once the first text delta arrives."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inbox.put_nowait({"type": "websocket.connect"})
        self.inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(
            {"type": "response.create", "model": "sim-1", "input": "go"})})

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "websocket.send" and '"response.output_text.delta"' in message["text"]:
            self.inbox.put_nowait({"type": "websocket.disconnect", "code": 1001})


SCOPE: dict[str, Any] = {
    "type": "websocket", "path": "/v1/responses", "root_path": "", "headers": [], "query_string": b"",
    "scheme": "ws", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "subprotocols": [],
    "asgi": {"version": "3.0"},
}


@pytest.mark.parametrize("disconnects", [1, 5])
async def test_disconnect_with_an_alongside_hook_is_billed_cancelled(caplog: pytest.LogCaptureFixture, disconnects: int) -> None:
    backend, hook, billing = EndlessBackend(), Watching(), Records()
    app = create_app(backend=backend, renderer=None, hooks=[hook], billing=billing)
    caplog.set_level(logging.ERROR)
    for _ in range(disconnects):
        peer = LeavingPeer()
        await asyncio.wait_for(app(dict(SCOPE), peer.receive, peer.send), 30)  # safety net only
    assert [r.status for r in billing.records] == ["cancelled"] * disconnects
    assert backend.open == 0 and backend.closed == disconnects
    assert hook.cancelled == disconnects
    assert not [r for r in caplog.records if "already running" in r.getMessage() or r.exc_info]
