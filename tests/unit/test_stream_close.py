"""The pipeline closes a backend's stream to the end, even when the turn is cancelled again while
it closes (closing the stream is what aborts the engine's request; cut short, an HTTP client can
leave the engine's connection open and the engine generates for nobody). Gate-based: nothing is
timed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

import msgspec
import pytest

from responses_cache import create_service
from responses_cache.backends.base import BackendEvent, GenerationRequest, TextDelta
from responses_cache.core.auth import AllowAll
from responses_cache.pipeline.closing import close_stream
from responses_cache.pipeline.turn import Lineage
from responses_cache.protocol import events as ev
from responses_cache.protocol.request import decode_create


class SlowClose:
    """Streams deltas without waiting; closing it waits on ``gate`` (its connection's close).
    ``closing`` is set when the close starts; ``closed`` counts the closes that ran to the end."""

    accepts_media = False

    def __init__(self) -> None:
        self.closing = asyncio.Event()
        self.gate = asyncio.Event()
        self.closed = 0
        self.interrupted = 0

    def models(self) -> Sequence[str]:
        return ["slow-close-1"]

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        try:
            while True:
                yield TextDelta("x ")
        finally:
            self.closing.set()
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.interrupted += 1
                raise
            self.closed += 1


async def test_a_turn_cancelled_again_while_closing_the_backends_stream_still_closes_it() -> None:
    engine = SlowClose()
    core = create_service(backend=engine, renderer=None, authenticator=AllowAll()).core
    request = decode_create(msgspec.json.encode({"model": "slow-close-1", "input": "Go on.", "store": False}))
    turn = core.prepare(request, "tenant", "websocket")
    route = core.router.resolve("slow-close-1", "tenant")
    streaming, stuck = asyncio.Event(), asyncio.Event()

    async def emit(event: ev.Event) -> None:
        if isinstance(event, ev.OutputTextDelta):
            streaming.set()
            await stuck.wait()  # a client that stopped reading: the turn waits here, not in the backend

    task = asyncio.ensure_future(core.run(turn, Lineage.first(turn), route, emit))
    await asyncio.wait_for(streaming.wait(), 60)  # the deadline only guards a broken build
    task.cancel()  # the client left
    await asyncio.wait_for(engine.closing.wait(), 60)
    task.cancel()  # and the turn is cancelled again while its backend closes
    engine.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 60)
    assert (engine.closed, engine.interrupted) == (1, 0)


async def test_close_stream_raises_the_closes_own_error() -> None:
    async def failing() -> AsyncGenerator[int, None]:
        try:
            yield 1
        finally:
            raise RuntimeError("the close failed")

    stream = failing()
    assert await stream.__anext__() == 1
    with pytest.raises(RuntimeError, match="the close failed"):
        await close_stream(stream)
    await close_stream(None)  # nothing to close
