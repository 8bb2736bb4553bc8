"""The *render* stage: append the new items' tokens to the parent's token log.

When the parent's log was rendered under the same fingerprint (template, encoding, instructions,
tools), the new items are appended to it — O(new items). Otherwise (no cached log, or changed
instructions/tools) the whole conversation is rendered again, which is always correct.

A compaction item is rendered as the model sees it: its summary as a user message
(:func:`~responses_cache.conversation.compaction.expanded`), one log item for one conversation item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..conversation import Conversation
from ..conversation.compaction import expand
from ..protocol.errors import ResponsesError, invalid_request
from ..protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    HostedItem,
    Item,
    Message,
    Reasoning,
    content_texts,
)
from ..protocol.tools import ToolSet
from ..storage.state import ResponseState
from ..tokens.base import longest_token_within, max_token_bytes
from ..tokens.errors import RenderError
from .truncate import DoesNotFit, truncate

if TYPE_CHECKING:
    from ..tokens.base import Renderer
    from ..tokens.log import TokenLog


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    log: TokenLog
    fingerprint: bytes
    #: Leading tokens shared with the parent's cached log (reported as ``cached_tokens``).
    cached_tokens: int
    incremental: bool
    #: Set when ``truncation: "auto"`` dropped items: the whole conversation the log holds now
    #: (the new base), and how many items were dropped from its start.
    kept: list[Item] | None = None
    dropped_items: int = 0
    #: The untruncated prompt's tokens (set with ``kept``).
    untruncated_tokens: int = 0
    #: How many of ``kept`` are system/developer messages moved ahead from the dropped part.
    kept_ahead: int = 0


@dataclass(frozen=True, slots=True)
class PromptSource:
    """What a prompt is rendered from: the ``parent`` (whose token log is extended when it has
    one), the ``context`` before the new ``items``, and the instructions and tools."""

    parent: ResponseState | None
    context: Conversation
    items: list[Item]
    instructions: str | None
    tools: ToolSet


def render(
    renderer: Renderer,
    source: PromptSource,
    *,
    context_window: int,
    truncate_to: int | None = None,
    truncation_headroom: float = 0.0,
) -> RenderedPrompt:
    """The prompt of ``context`` + ``items``. With ``truncate_to`` (``truncation: "auto"``), a
    prompt over that many tokens has whole items dropped from its start until it fits (see
    :mod:`~responses_cache.pipeline.truncate`); without it, a prompt over ``context_window`` is
    ``context_length_exceeded``. A cut prompt is cut down to ``1 - truncation_headroom`` of
    ``truncate_to`` where it can be, so that the next turns append to it instead of cutting again."""
    parent, context, items, instructions, tools = source.parent, source.context, source.items, source.instructions, source.tools
    fingerprint = renderer.fingerprint(instructions, tools)
    incremental_attempt = parent is not None and parent.token_log is not None and parent.fingerprint == fingerprint
    # Reject what cannot fit before tokenizing it (a known parent log counts exactly).
    known = parent.token_log.num_tokens if incremental_attempt and parent is not None and parent.token_log is not None else 0
    floor = known + token_floor(renderer, items, context_window - known)
    if floor > context_window and truncate_to is None:
        raise _too_long(context_window, floor, at_least=True)
    try:
        if incremental_attempt:
            assert parent is not None and parent.token_log is not None
            log = renderer.extend(parent.token_log, expand(items))
            cached, incremental = log.common_prefix(parent.token_log), True
        else:
            log = renderer.render_full(instructions, tools, expand([*context.items(), *items]))
            cached, incremental = 0, False
    except RenderError as exc:
        # Items before the new ones rendered fine last turn, so the index points into ``items``
        # unless this was a full render of context + items.
        index = exc.item_index - (0 if incremental_attempt else len(context))
        param = f"input[{index}].{exc.param}" if index >= 0 else "input"
        raise invalid_request(exc.message, param, "unsupported_value") from None
    if truncate_to is not None and log.num_tokens > truncate_to:
        target = truncate_to - int(truncate_to * truncation_headroom)
        return _truncated(renderer, source, log, fingerprint, truncate_to, target)
    if log.num_tokens > context_window:
        tokens = log.num_tokens
        del log  # not kept alive by the error's traceback: a megabyte input's tokens go now
        raise _too_long(context_window, tokens, at_least=False)
    return RenderedPrompt(log, fingerprint, cached, incremental)


def _truncated(
    renderer: Renderer, source: PromptSource, log: TokenLog, fingerprint: bytes, budget: int, target: int
) -> RenderedPrompt:
    """The conversation cut to fit ``budget`` (``truncation: "auto"``): a full render of the kept
    items, which become the conversation's new base."""
    parent, context, items, instructions, tools = source.parent, source.context, source.items, source.instructions, source.tools
    conversation = [*context.items(), *items]
    if log.num_items != len(conversation):  # a log that does not cover the context: measure afresh
        log = renderer.render_full(instructions, tools, expand(conversation))
    try:
        cut = truncate(renderer, instructions, tools, conversation, log, target)
    except DoesNotFit:
        try:  # not down to the target: as far as the budget, then
            cut = truncate(renderer, instructions, tools, conversation, log, budget)
        except DoesNotFit as exc:
            raise _too_long(budget, exc.smallest, at_least=False) from None
    cached = cut.log.common_prefix(parent.token_log) if parent is not None and parent.token_log is not None else 0
    return RenderedPrompt(
        cut.log, fingerprint, cached, False, cut.kept, cut.dropped_items, log.num_tokens, cut.kept_ahead
    )


def _too_long(context_window: int, tokens: int, *, at_least: bool) -> ResponsesError:
    return ResponsesError(
        f"This model's maximum context length is {context_window} tokens. However, your "
        f"messages resulted in {'at least ' if at_least else ''}{tokens} tokens. Please reduce the length of the messages.",
        code="context_length_exceeded",
        param="input",
    )


#: Above ``room * this`` characters the floor is refined by the text's own bytes (see token_floor).
_REFINE_FACTOR = 4


def token_floor(renderer: Renderer, items: Sequence[Item], room: int) -> int:
    """At least how many tokens the items' text will take, computed without tokenizing.

    Every token is a substring of the text it encodes, so it is no longer than the vocabulary's
    longest byte string (``max_token_bytes``), and no longer than the longest token made only of
    bytes the text contains (``longest_token_within``): text of ``n`` bytes needs at least ``n /
    that`` tokens. The first bound is free; the second costs a scan for each distinct byte and is
    taken only when the text is large enough to matter (it turns a 10 MB one-word input into an
    immediate refusal instead of seconds of tokenizing). Reasoning items are left out: a template
    may hide them from the prompt."""
    texts = _prompt_texts(items)
    chars = sum(map(len, texts))
    encoding = renderer.encoding
    floor = chars // max_token_bytes(encoding)
    if floor <= room and chars > _REFINE_FACTOR * max(room, 0):
        data = "".join(texts).encode("utf-8", "surrogatepass")
        floor = len(data) // longest_token_within(encoding, data)
    return floor


def _prompt_texts(items: Sequence[Item]) -> list[str]:
    """The texts of the items that every template renders into the prompt."""
    out: list[str] = []
    for item in items:
        if isinstance(item, Message):
            out.extend(content_texts(item.content))
        elif isinstance(item, FunctionCall):
            out.append(item.arguments)
        elif isinstance(item, FunctionCallOutput):
            out.extend(content_texts(item.output))
    return out


def text_chars(items: Sequence[Item]) -> int:
    """Characters of text the items carry (what rendering them tokenizes, structure aside)."""
    total = 0
    for item in items:
        if isinstance(item, Message):
            total += sum(map(len, content_texts(item.content)))
        elif isinstance(item, FunctionCall):
            total += len(item.arguments) + len(item.name)
        elif isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
            total += sum(map(len, content_texts(item.output)))
        elif isinstance(item, CustomToolCall):
            total += len(item.input) + len(item.name)
        elif isinstance(item, Reasoning):
            total += sum(len(s.text) for s in item.summary) + sum(len(c.text) for c in item.content or ())
        elif isinstance(item, HostedItem):
            total += len(item.raw)
    return total


def extend_with_output(
    renderer: Renderer, log: TokenLog, output: Sequence[Item], sampled: Sequence[int] | None
) -> TokenLog:
    """Append the assistant's output (as sampled ids when the engine gave them all)."""
    if not output:
        return log
    return renderer.extend(log, output, sampled=sampled)
