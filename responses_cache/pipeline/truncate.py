"""``truncation: "auto"``: drop whole items from the start of the conversation until the prompt fits.

The conversation is measured with the token log the render stage already built (per-item sizes
from :meth:`~responses_cache.tokens.log.TokenLog.item_ends`, no re-tokenizing), the first cut
that fits is chosen, and the kept items are rendered from scratch: that render *is* the prompt,
so the engine gets exactly a full render of what was kept. The kept items become the
conversation's new base; later turns append to its token log as usual.

What is never cut:

* the header (instructions and tools) and every ``system``/``developer`` message: those of the
  dropped part are kept, in order, ahead of the rest;
* a tool call and its output: the cut never falls between a call and its output (parallel calls
  included), so no output is kept without its call;
* the last item: a conversation whose last item alone does not fit is refused
  (``context_length_exceeded``), as without truncation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..conversation.compaction import expand
from ..protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
)

if TYPE_CHECKING:
    from ..protocol.tools import ToolSet
    from ..tokens.base import Renderer
    from ..tokens.log import TokenLog


@dataclass(frozen=True, slots=True)
class Truncated:
    #: The items the prompt holds now (kept system/developer messages first).
    kept: list[Item]
    #: Their full render (header and every kept item).
    log: TokenLog
    #: Items dropped from the start of the conversation.
    dropped_items: int
    #: How many of ``kept`` are system/developer messages moved ahead from the dropped part.
    kept_ahead: int = 0


class DoesNotFit(Exception):
    """No cut makes the prompt fit (the last item alone is too long)."""

    def __init__(self, smallest: int) -> None:
        super().__init__(smallest)
        #: The smallest prompt a cut could give (for the error message).
        self.smallest = smallest


def kept_always(item: Item) -> bool:
    """Is ``item`` kept whatever a cut drops (a system or developer message)?"""
    return isinstance(item, Message) and item.role in ("system", "developer")


def truncate(
    renderer: Renderer,
    instructions: str | None,
    tools: ToolSet,
    items: Sequence[Item],
    log: TokenLog,
    budget: int,
) -> Truncated:
    """The shortest-cut render of ``items`` (rendered as ``log``) within ``budget`` tokens.

    Cuts are tried from the start; a cut is rendered only when the sizes measured in ``log`` say
    it fits, and taken when its render does (a template that rewrites history — harmony hiding
    earlier analysis — can make a render differ from the sum of its items). Raises
    :class:`DoesNotFit` when no cut fits. ``log`` renders the items as the model sees them
    (compaction items expanded), and so does the kept items' render."""
    if log.num_items != len(items):
        raise ValueError(f"the log holds {log.num_items} items, not the conversation's {len(items)}")
    ends = log.item_ends()
    header = log.header_tokens
    total = log.num_tokens
    # Where each call is answered (the last output that names it).
    answered: dict[str, int] = {}
    for i, item in enumerate(items):
        if isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
            answered[item.call_id] = i
    always: list[Item] = []
    always_tokens = 0
    pending = -1  # the furthest output of a call in the dropped part
    smallest = total
    for k in range(1, len(items)):  # drop items[:k]; the last item always stays
        item = items[k - 1]
        size = ends[k - 1] - (ends[k - 2] if k > 1 else header)
        if kept_always(item):
            always.append(item)
            always_tokens += size
        elif isinstance(item, (FunctionCall, CustomToolCall)):
            pending = max(pending, answered.get(item.call_id, -1))
        if pending >= k:
            continue  # the cut would separate a call from its output
        estimate = header + always_tokens + total - ends[k - 1]
        smallest = min(smallest, estimate)
        if estimate > budget:
            continue
        kept = [*always, *items[k:]]
        rendered = renderer.render_full(instructions, tools, expand(kept))
        if rendered.num_tokens <= budget:
            return Truncated(kept, rendered, k - len(always), len(always))
        smallest = min(smallest, rendered.num_tokens)
    raise DoesNotFit(smallest)
