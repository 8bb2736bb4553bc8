"""A testing kit for people who write their own stages and backends.

* :class:`RecordingBackend` wraps any backend and records every :class:`GenerationRequest`, so a
  test can assert exactly what the engine was given (context fidelity).
* :class:`ScriptedBackend` replays scripted event lists, one per generation.
* :func:`context_of` reduces a request to what determines the model's context (ids and statuses
  do not), so two requests can be compared.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec

from .backends.base import Backend, BackendEvent, Finish, GenerationRequest
from .backends.simulated import SimulatedConfig, SimulatedEngine
from .protocol.items import FunctionCall, FunctionCallOutput, Item, Message, Reasoning, text_of


class RecordingBackend:
    """Records each request, then delegates to ``inner`` (an instant simulated engine by default)."""

    accepts_media = True

    def __init__(self, inner: Backend | None = None) -> None:
        self.inner: Backend = inner or SimulatedEngine(SimulatedConfig(instant=True))
        self.requests: list[GenerationRequest] = []

    def models(self) -> Sequence[str]:
        return self.inner.models()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        self.requests.append(request)
        async for event in self.inner.generate(request):
            yield event


class ScriptedBackend:
    """Yields ``scripts[i]`` for the i-th generation (the last script repeats)."""

    accepts_media = True

    def __init__(self, scripts: Sequence[Sequence[BackendEvent]], models: Sequence[str] = ("sim-1",)) -> None:
        if not scripts:
            raise ValueError("ScriptedBackend needs at least one script")
        self.scripts = [list(s) for s in scripts]
        self._models = list(models)
        self.calls = 0

    def models(self) -> Sequence[str]:
        return self._models

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        script = self.scripts[min(self.calls, len(self.scripts) - 1)]
        self.calls += 1
        for event in script:
            yield event
        if not script or not isinstance(script[-1], Finish):
            yield Finish()


def item_identity(item: Item) -> tuple[Any, ...]:
    """What makes an item part of the context (ids and statuses do not)."""
    if isinstance(item, Message):
        return ("message", item.role, text_of(item.content))
    if isinstance(item, FunctionCall):
        return ("function_call", item.call_id, item.name, item.arguments)
    if isinstance(item, FunctionCallOutput):
        out = item.output if isinstance(item.output, str) else text_of(item.output)
        return ("function_call_output", item.call_id, out)
    if isinstance(item, Reasoning):
        return ("reasoning", msgspec.json.encode(item.summary), msgspec.json.encode(item.content), item.encrypted_content)
    raise TypeError(item)


def context_of(request: GenerationRequest) -> dict[str, Any]:
    """The parts of a request that decide what the model sees."""
    prompt = list(request.prompt.tokens()) if request.prompt is not None else None
    return {
        "instructions": request.instructions,
        "tools": request.tools.fingerprint,
        "items": [item_identity(i) for i in request.conversation.items()],
        "prompt": prompt,
    }
