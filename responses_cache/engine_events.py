"""What an engine streams back: the events a backend yields and an output parser produces.

A leaf module (it imports nothing of the package), so both :mod:`responses_cache.tokens` (whose
output parsers turn sampled text into these events) and :mod:`responses_cache.backends` (whose
``Backend.generate`` yields them) import it without importing each other. The public names are
re-exported from :mod:`responses_cache.backends` and the package root.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Assistant message text. ``token_ids``: the sampled ids, when the engine reports them."""

    text: str
    token_ids: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Raw chain-of-thought text (rendered back as an analysis/reasoning item)."""

    text: str
    token_ids: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A new tool call; its arguments follow as :class:`ToolCallDelta` values. ``custom=True``
    starts a call of a custom (freeform) tool: the deltas are then its plain-text ``input``."""

    name: str
    call_id: str | None = None
    namespace: str | None = None
    custom: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """Function-call arguments (JSON text), or a custom tool call's input text."""

    arguments: str
    token_ids: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class EngineUsage:
    """What the engine measured; fields left ``None`` are computed by the pipeline."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Finish:
    """The end of generation. ``reason``: ``stop`` (or ``tool_calls``), ``length``, ``content_filter``."""

    reason: Literal["stop", "tool_calls", "length", "content_filter"] = "stop"
    usage: EngineUsage | None = None
    #: The complete sampled id stream after the generation prompt, structural tokens included
    #: (for harmony: ``<|channel|>…<|message|>…<|end|>``). When given, the assistant turn is kept
    #: in the token log as exactly these ids; otherwise it is rendered from the output items.
    token_ids: Sequence[int] | None = None


BackendEvent = TextDelta | ReasoningDelta | ToolCallStart | ToolCallDelta | Finish
