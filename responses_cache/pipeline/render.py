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
from ..protocol.items import Item
from ..protocol.tools import ToolSet
from ..state import ResponseState
from ..tokens.errors import RenderError

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


def render(
    renderer: Renderer,
    parent: ResponseState | None,
    context: Conversation,
    items: list[Item],
    instructions: str | None,
    tools: ToolSet,
    *,
    context_window: int,
) -> RenderedPrompt:
    fingerprint = renderer.fingerprint(instructions, tools)
    incremental_attempt = parent is not None and parent.token_log is not None and parent.fingerprint == fingerprint
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
        raise ResponsesError(
            f"This model's maximum context length is {context_window} tokens. However, your "
            f"messages resulted in {log.num_tokens} tokens. Please reduce the length of the messages.",
            code="context_length_exceeded",
            param="input",
        )
    return RenderedPrompt(log, fingerprint, cached, incremental)


def extend_with_output(
    renderer: Renderer, log: TokenLog, output: Sequence[Item], sampled: Sequence[int] | None
) -> TokenLog:
    """Append the assistant's output (as sampled ids when the engine gave them all)."""
    if not output:
        return log
    return renderer.extend(log, output, sampled=sampled)
