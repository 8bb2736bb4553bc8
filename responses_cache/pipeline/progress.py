"""A response in progress: from ``response.created`` to its terminal event."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from typing import Any

from ..backends.base import BackendEvent, EngineUsage, Finish, GenerationRequest
from ..conversation import Conversation
from ..observability.tracing import NO_STAGE, StageSpan
from ..protocol.items import Item
from ..protocol.response import IncompleteDetails, ResponseErrorInfo
from .generate import OutputBuilder
from .hooks import Flag
from .observe import EngineClock
from .render import RenderedPrompt


@dataclasses.dataclass(slots=True, eq=False)
class EngineCall:
    """The response's engine call: its request, a preflight stream ``opened`` until it streams,
    its spans (they end with it) and its clock."""

    generation: GenerationRequest | None = None
    opened: AsyncGenerator[BackendEvent, None] | None = None
    span: StageSpan = NO_STAGE
    first_token: StageSpan = NO_STAGE
    clock: EngineClock = dataclasses.field(default_factory=EngineClock)

    def end(self, error: BaseException | None = None) -> None:
        """End the engine stages (idempotent)."""
        self.first_token.end(error)
        self.span.end(error)


@dataclasses.dataclass(slots=True, eq=False)
class Progress:
    """A response from ``response.created`` to its terminal event: its output so far, the context
    and prompt it has grown to (a compaction replaces them; ``response.append`` rounds extend
    them), its engine call, and how it ends."""

    out: OutputBuilder
    rendered: RenderedPrompt | None
    #: The rendered prompt when ``truncation: "auto"`` cut the conversation.
    truncated: RenderedPrompt | None
    context: Conversation
    #: The conversation's new base when this turn replaced what came before (``None``: it did not).
    base: list[Item] | None
    hook_state: dict[str, Any]
    compact_now: bool
    engine: EngineCall = dataclasses.field(default_factory=EngineCall)
    # What the engine calls gave: the late flag, alongside hooks' states, the last call's end.
    late_flag: Flag | None = None
    alongside_state: dict[str, Any] = dataclasses.field(default_factory=dict)
    finish: Finish | None = None
    engine_usage: EngineUsage | None = None
    # Engine calls finished before the current one (prompt, cached, output tokens), where the
    # current one's output starts, the output item it starts at, and the items after the input
    # before it (output and appended tool outputs, in order).
    spent: tuple[int, int, int] = (0, 0, 0)
    output_start: int = 0
    round_start: int = 0
    earlier: list[Item] = dataclasses.field(default_factory=list)
    #: Output items before the engine's (the compaction item of an automatic compaction).
    first_output: int = 0
    # How it ends.
    status: str = "completed"
    failure: BaseException | None = None
    error: ResponseErrorInfo | None = None
    incomplete: IncompleteDetails | None = None

    @property
    def after_input(self) -> list[Item]:
        """After the input: the output, with the tool outputs appended into it where they came."""
        return [*self.earlier, *self.out.output[self.round_start :]]
