"""A backend whose generations wait until the test lets each one go, for the tests that need
turns in flight at the same time (quota slots, charges of turns that end together)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from responses_cache import SimulatedConfig, SimulatedEngine
from responses_cache.backends.base import BackendEvent, GenerationRequest
from responses_cache.testing import RecordingBackend


class HeldBackend(RecordingBackend):
    """Each generation waits until the test lets one go (``go.release()``)."""

    def __init__(self) -> None:
        super().__init__(SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=3)))
        self.go = asyncio.Semaphore(0)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self.requests.append(request)
        await self.go.acquire()
        async for event in self.inner.generate(request):
            yield event
