"""The *render* stage: append the new items' tokens to the parent's token log.

When the parent's log was rendered under the same fingerprint (template, encoding, instructions,
tools), the new items are appended to it — O(new items). Otherwise (no cached log, or changed
instructions/tools) the whole conversation is rendered again, which is always correct.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..conversation import Conversation
from ..protocol.errors import ResponsesError, invalid_request
from ..protocol.items import FunctionCall, FunctionCallOutput, Item, Message, content_texts
from ..protocol.tools import ToolSet
from ..state import ResponseState
from ..tokens.base import max_token_bytes
from ..tokens.errors import RenderError

if TYPE_CHECKING:
    from ..tokens.base import Renderer
    from ..tokens.log import TokenLog


@dataclass(frozen=True, slots=True)
class Rendered:
    log: TokenLog
    fingerprint: bytes
    #: Leading tokens shared with the parent's cached log (reported as ``cached_tokens``).
    cached_tokens: int
    incremental: bool


def render(
    renderer: Renderer,
    parent: ResponseState | None,
    context: Conversation,
    items: list[Item],
    instructions: str | None,
    tools: ToolSet,
    *,
    context_window: int,
) -> Rendered:
    fingerprint = renderer.fingerprint(instructions, tools)
    incremental_attempt = parent is not None and parent.token_log is not None and parent.fingerprint == fingerprint
    # Reject what cannot fit before tokenizing it: no token is longer than the vocabulary's longest
    # byte string, so ``characters / that length`` tokens is a floor, and a known parent log counts exactly.
    known = parent.token_log.num_tokens if incremental_attempt and parent is not None and parent.token_log is not None else 0
    floor = known + text_chars(items) // max_token_bytes(renderer.encoding)
    if floor > context_window:
        raise _too_long(context_window, floor, at_least=True)
    try:
        if incremental_attempt:
            assert parent is not None and parent.token_log is not None
            log = renderer.extend(parent.token_log, items)
            cached, incremental = log.common_prefix(parent.token_log), True
        else:
            log = renderer.render_full(instructions, tools, [*context.items(), *items])
            cached, incremental = 0, False
    except RenderError as exc:
        # Items before the new ones rendered fine last turn, so the index points into ``items``
        # unless this was a full render of context + items.
        index = exc.item_index - (0 if incremental_attempt else len(context))
        param = f"input[{index}].{exc.param}" if index >= 0 else "input"
        raise invalid_request(exc.message, param, "unsupported_value") from None
    if log.num_tokens > context_window:
        raise _too_long(context_window, log.num_tokens, at_least=False)
    return Rendered(log, fingerprint, cached, incremental)


def _too_long(context_window: int, tokens: int, *, at_least: bool) -> ResponsesError:
    return ResponsesError(
        f"This model's maximum context length is {context_window} tokens. However, your "
        f"messages resulted in {'at least ' if at_least else ''}{tokens} tokens. Please reduce the length of the messages.",
        code="context_length_exceeded",
        param="input",
    )


def text_chars(items: Sequence[Item]) -> int:
    """Characters of text the items carry (what rendering them tokenizes, structure aside)."""
    total = 0
    for item in items:
        if isinstance(item, Message):
            total += sum(map(len, content_texts(item.content)))
        elif isinstance(item, FunctionCall):
            total += len(item.arguments) + len(item.name)
        elif isinstance(item, FunctionCallOutput):
            total += sum(map(len, content_texts(item.output)))
        else:
            total += sum(len(s.text) for s in item.summary) + sum(len(c.text) for c in item.content or ())
    return total


def extend_with_output(
    renderer: Renderer, log: TokenLog, output: list[Item], sampled: Sequence[int] | None
) -> TokenLog:
    """Append the assistant's output (as sampled ids when the engine gave them all)."""
    if not output:
        return log
    return renderer.extend(log, output, sampled=sampled)
