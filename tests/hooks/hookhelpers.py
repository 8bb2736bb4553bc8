"""Helpers of the hooks suite: a gate that orders a late flag deterministically against the stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from responses_cache.backends.base import BackendEvent, Finish, GenerationRequest, TextDelta
from responses_cache.pipeline.hooks import HookContext, Phase, Verdict
from responses_cache.protocol.items import Item


class Gate:
    """Per-response events, created lazily in whichever loop serves the response."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def event(self, response_id: str) -> asyncio.Event:
        return self._events.setdefault(response_id, asyncio.Event())


class GatedBackend:
    """Yields ``first``, waits until the alongside hooks of the response are done, then the rest:
    the order of a late flag against the stream is deterministic."""

    accepts_media = True

    def __init__(
        self, gate: Gate, first: str = "Hello", rest: Sequence[str] = (" world", "!")
    ) -> None:
        self.gate = gate
        self.first = first
        self.rest = list(rest)

    def models(self) -> Sequence[str]:
        return ["gated-1"]

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        yield TextDelta(self.first)
        await asyncio.wait_for(self.gate.event(request.response_id).wait(), 5)
        for text in self.rest:
            yield TextDelta(text)
        yield Finish()


class GatedHook:
    """Runs ``inner``, then opens the response's gate (after the verdict is ready)."""

    def __init__(self, inner: Any, gate: Gate) -> None:
        self.inner = inner
        self.gate = gate
        self.name: str = inner.name
        self.phase: Phase = inner.phase

    async def __call__(self, ctx: HookContext, new_items: Sequence[Item], state: Any) -> Verdict:
        try:
            verdict: Verdict = await self.inner(ctx, new_items, state)
            return verdict
        finally:
            asyncio.get_running_loop().call_soon(self.gate.event(ctx.response_id).set)
