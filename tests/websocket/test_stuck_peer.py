"""A peer that stops reading cannot pin memory: writes time out, the lifetime holds even while
writes are blocked, and the input a connection holds is bounded per connection and per process.

Driven in-process through ASGI (a peer whose sends never complete), and checked by what is
retained afterwards (connections, budget bytes, open backend streams), never by timing."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import msgspec
import pytest

from responses_cache import create_service
from responses_cache.core.auth import AllowAll
from responses_cache.edge.app import app_for
from responses_cache.edge.websocket import WebSocketMode
from responses_cache.session.session import InputBudget, PendingTurn, Session, SessionConfig
from responses_cache.testing import EndlessBackend

SCOPE: dict[str, Any] = {
    "type": "websocket", "path": "/v1/responses", "root_path": "", "headers": [], "query_string": b"",
    "scheme": "ws", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "subprotocols": [],
    "asgi": {"version": "3.0"},
}




class StuckPeer:
    """Accepts, then never completes a send (its receive window is full and it does not read)."""

    def __init__(self, frames: list[str]) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inbox.put_nowait({"type": "websocket.connect"})
        for frame in frames:
            self.inbox.put_nowait({"type": "websocket.receive", "text": frame})
        self.sends = 0

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()  # never a disconnect: the socket stays "established"

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "websocket.accept":
            return
        self.sends += 1
        await asyncio.Event().wait()  # blocked forever


def _mode(backend: EndlessBackend, config: SessionConfig, **options: Any) -> WebSocketMode:
    service = create_service(backend=backend, renderer=None, authenticator=AllowAll(), session=config, **options)
    return WebSocketMode(app_for(service), service)


def _create(size: int, lane: str | None = None) -> str:
    body: dict[str, Any] = {"type": "response.create", "model": "sim-1", "input": "x" * size}
    if lane is not None:
        body["stream_id"] = lane
    return json.dumps(body)


async def _run(mode: WebSocketMode, peer: StuckPeer) -> None:
    # The safety net only keeps a broken build from hanging the suite; nothing is timed.
    await asyncio.wait_for(mode(dict(SCOPE), peer.receive, peer.send), 60)  # type: ignore[arg-type]


async def test_a_write_that_never_completes_aborts_the_connection_and_frees_its_state() -> None:
    backend = EndlessBackend()
    mode = _mode(backend, SessionConfig(max_queued_bytes=4 * 1024 * 1024), write_timeout_s=0.2,
                 process_input_bytes=64 * 1024 * 1024)
    peer = StuckPeer([_create(1024 * 1024) for _ in range(20)])
    await _run(mode, peer)
    assert mode.aborted == 1 and mode.connections == 0
    assert mode.input_budget is not None and mode.input_budget.held == 0
    assert mode.input_budget.peak <= 4 * 1024 * 1024 + 1024  # the per-connection budget held
    assert backend.open == 0  # every generation that started was told to stop


async def test_events_queued_for_a_peer_that_does_not_read_are_bounded_in_bytes() -> None:
    """Sixteen turns whose events echo 100 kB of instructions, for a peer that takes nothing: what
    waits for the peer stays within ``outbound_bytes`` plus one event; the turns wait instead."""
    backend = EndlessBackend()
    mode = _mode(backend, SessionConfig(), write_timeout_s=0.5, outbound_bytes=256 * 1024)
    instructions = "x" * 100_000
    frames = [
        json.dumps({"type": "response.create", "model": "sim-1", "input": "hi", "instructions": instructions, "stream_id": str(i)})
        for i in range(16)
    ]
    peer = StuckPeer(frames)
    await _run(mode, peer)
    assert mode.aborted == 1 and backend.open == 0
    assert 100_000 < mode.outbound_peak <= 256 * 1024 + 110_000


async def test_the_lifetime_is_enforced_while_writes_are_blocked() -> None:
    backend = EndlessBackend()
    config = SessionConfig(lifetime_s=0.1, lifetime_grace_s=0.1)
    mode = _mode(backend, config, write_timeout_s=3600.0)  # the write timeout never fires
    peer = StuckPeer([_create(1000, lane=str(i)) for i in range(4)])
    await _run(mode, peer)
    assert mode.aborted == 1 and mode.connections == 0
    assert mode.input_budget is not None and mode.input_budget.held == 0
    assert backend.open == 0


async def test_the_process_input_budget_is_shared_by_connections() -> None:
    backend = EndlessBackend()
    mode = _mode(backend, SessionConfig(), write_timeout_s=0.2, process_input_bytes=3 * 1024 * 1024)
    peers = [StuckPeer([_create(1024 * 1024, lane=str(i)) for i in range(3)]) for _ in range(3)]
    await asyncio.gather(*(_run(mode, p) for p in peers))
    assert mode.input_budget is not None
    assert mode.input_budget.peak <= 3 * 1024 * 1024 and mode.input_budget.refusals > 0
    assert mode.input_budget.held == 0 and mode.connections == 0 and backend.open == 0


# -- the session's accounting, sans-I/O -------------------------------------------------------------


def _frame(size: int, lane: str) -> str:
    return _create(size, lane)


def test_session_charges_held_input_until_each_turn_finishes() -> None:
    budget = InputBudget(10_000)
    session = Session("t", SessionConfig(max_queued_bytes=5_000), input_budget=budget)
    for lane in "abc":
        session.receive(_frame(2_000, lane))
    errors = session.drain()
    assert len(errors) == 1 and errors[0].status == 429  # the third frame would pass 5,000 bytes
    assert session.queued_bytes == budget.held and 4_000 < budget.held <= 5_000
    started: list[PendingTurn] = session.startable()
    assert len(started) == 2 and session.queued_bytes == budget.held  # running turns still hold theirs
    session.finished(started[0], None)
    assert 2_000 < budget.held < 2_500
    session.close()  # the running one is released with the connection
    assert budget.held == 0 and session.queued_bytes == 0


def test_one_frame_on_an_idle_connection_is_admitted_whatever_its_size() -> None:
    session = Session("t", SessionConfig(max_queued_bytes=100))
    session.receive(_frame(1_000, "a"))
    assert session.drain() == [] and session.queued_bytes > 1_000
    session.receive(_frame(10, "b"))
    assert [e.status for e in session.drain()] == [429]


def test_held_input_is_counted_in_bytes_on_the_wire() -> None:
    """A frame of 1,000 ``é`` is 2,000 bytes in UTF-8 (what the client sent), not 1,000; and once
    decoded its text takes memory of its own (1 byte a character for ``é``), so it is charged both."""
    budget = InputBudget(1_000_000)
    session = Session("t", SessionConfig(), input_budget=budget)
    frame = json.dumps({"type": "response.create", "model": "sim-1", "input": "é" * 1_000}, ensure_ascii=False)
    session.receive(frame)
    assert session.drain() == []
    assert len(frame.encode()) == len(frame) + 1_000
    assert session.queued_bytes == budget.held == len(frame.encode()) + sys.getsizeof(frame)


def test_a_wide_frame_is_charged_what_python_holds_of_it() -> None:
    """One emoji makes Python hold a whole text at 4 bytes a character: a frame of 10,000 ASCII
    characters and one emoji is 10,004 bytes on the wire but may hold about 40 kB once decoded."""
    budget = InputBudget(1_000_000)
    session = Session("t", SessionConfig(), input_budget=budget)
    frame = json.dumps({"type": "response.create", "model": "sim-1", "input": "y" * 10_000 + "🙂"}, ensure_ascii=False)
    session.receive(frame)
    assert session.drain() == []
    assert budget.held == session.queued_bytes > 4 * len(frame) + len(frame.encode())


def test_a_queued_turn_holds_a_wide_frame_as_its_utf8() -> None:
    """While it waits, a turn holds its frame no wider than it was sent (not as a 4-byte-a-character
    text), and once its input is decoded the request lets the frame go."""
    from responses_cache.session.session import held_frame

    text = json.dumps({"type": "response.create", "model": "sim-1", "input": "y" * 10_000 + "🙂"}, ensure_ascii=False)
    held = held_frame(text)
    assert isinstance(held, bytes) and held == text.encode()
    ascii_text = json.dumps({"type": "response.create", "model": "sim-1", "input": "y"})
    assert held_frame(ascii_text) is ascii_text


def test_a_prepared_turn_no_longer_points_into_its_frame() -> None:
    """The request's raw ``input`` and ``tools`` point into the frame; once the turn is prepared
    (input decoded, tools parsed) the request holds neither, so the frame is freed while the turn
    runs and only its decoded input is held (what its charge covers)."""
    from responses_cache.protocol.request import decode_create

    service = create_service(backend=EndlessBackend(), authenticator=AllowAll())
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]
    frame = json.dumps({"model": "sim-1", "input": "y" * 100_000, "tools": tools}).encode()
    alone = sys.getrefcount(frame)
    request = decode_create(frame)
    assert sys.getrefcount(frame) > alone  # the raw fields point into it
    turn = service.core.prepare(request, "t", "websocket")
    del request
    assert sys.getrefcount(frame) == alone
    assert turn.items[0].content == "y" * 100_000 and [t.name for _, t in turn.tools.functions()] == ["f"]
    assert msgspec.json.decode(turn.request.tools) == tools  # a steering successor reruns with them


def test_expiry_releases_what_was_queued() -> None:
    budget = InputBudget(1_000_000)
    session = Session("t", SessionConfig(lifetime_s=10), input_budget=budget)
    session.receive(_frame(100, "a"))
    session.receive(_frame(100, "a"))
    (first,) = session.startable()
    session.tick(11)  # the queued one is refused and released; the running one still holds its frame
    assert 0 < budget.held < 300
    session.finished(first, None)
    assert budget.held == 0


@pytest.mark.parametrize("size", [0, -1])
def test_the_process_budget_must_be_positive(size: int) -> None:
    with pytest.raises(ValueError):
        InputBudget(size)


class FloodingPeer:
    """Sends its frames, then leaves (the disconnect follows them); takes every event at once."""

    def __init__(self, frames: list[str]) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inbox.put_nowait({"type": "websocket.connect"})
        for frame in frames:
            self.inbox.put_nowait({"type": "websocket.receive", "text": frame})
        self.inbox.put_nowait({"type": "websocket.disconnect", "code": 1006})

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: dict[str, Any]) -> None:
        return None


@pytest.mark.parametrize("frames, released", [(3, 1), (1, 0)])
async def test_a_connection_that_took_large_frames_returns_free_memory_when_it_closes(
    monkeypatch: pytest.MonkeyPatch, frames: int, released: int
) -> None:
    """What its frames made the allocator keep goes back to the system once the connection has
    gone: counted, once per connection that took at least ``RELEASE_AFTER_BYTES`` (three 3 MB
    frames), and not for a small one."""
    from responses_cache.edge import websocket
    from responses_cache.limits.memory import RELEASE_AFTER_BYTES

    calls: list[int] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def release() -> bool:
        calls.append(1)
        loop.call_soon_threadsafe(done.set)
        return True

    monkeypatch.setattr(websocket, "release_free_memory", release)
    monkeypatch.setattr(websocket, "_RELEASE_DELAY_S", 0.0)
    mode = _mode(EndlessBackend(), SessionConfig(), write_timeout_s=5.0)
    size = 3_000_000
    assert frames * size >= RELEASE_AFTER_BYTES or frames == 1
    await _run(mode, FloodingPeer([_create(size, lane=str(i)) for i in range(frames)]))
    assert mode.connections == 0
    if released:
        await asyncio.wait_for(done.wait(), 10)  # a safety net, not a measurement
    else:
        for _ in range(10):
            await asyncio.sleep(0)  # what a call scheduled at once would have needed to run
    assert len(calls) == released
