"""The turn's prologue helpers: what its items continue, and how its errors count the input.

validate → continuation → render runs once per turn, in :meth:`TurnRun.prologue
<responses_cache.pipeline.run.TurnRun.prologue>`; these are its pure pieces.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..backends.routing import Route
from ..conversation import EMPTY, Conversation
from ..conversation.compaction import history_start, replaces_history
from ..protocol.errors import ResponsesError, invalid_request
from ..protocol.items import CompactionTrigger, Item
from ..protocol.request import CreateResponse
from ..storage.state import ResponseState

_INPUT_INDEX = re.compile(r"input\[(\d+)\]")


def renumbered(exc: ResponsesError, reused: int) -> ResponsesError:
    """``exc`` with its ``input[i]`` param counted in the client's whole input: a full-input
    request matched against the cache runs only its items after the ``reused`` ones."""
    param = exc.param
    if not reused or param is None or (m := _INPUT_INDEX.match(param)) is None:
        return exc
    exc.param = f"input[{int(m.group(1)) + reused}]{param[m.end():]}"
    return exc


@dataclasses.dataclass(frozen=True, slots=True)
class Continuation:
    """What a turn's items continue: the parent to append to (``None``: render in full), the
    context before the items, the items that enter the context, and the new base when an
    automatic compaction's item among them replaced everything before it (``None`` otherwise)."""

    parent: ResponseState | None
    context: Conversation
    items: list[Item]
    base: list[Item] | None


def continuation(parent: ResponseState | None, items: list[Item]) -> Continuation:
    """The latest item made by automatic compaction replaces everything before it (a client may
    resend the items before it or not: the model sees the same conversation)."""
    context = parent.conversation if parent else EMPTY
    start = history_start(items)
    if start or (context.count and items and replaces_history(items[0])):
        return Continuation(None, EMPTY, items[start:], items[start:])
    return Continuation(parent, context, items, None)


def compaction_trigger(items: list[Item]) -> tuple[list[Item], bool]:
    """``items`` without a final ``compaction_trigger`` item, and whether there was one (it
    compacts the context now); one anywhere else is a 400."""
    for index, item in enumerate(items):
        if isinstance(item, CompactionTrigger) and index != len(items) - 1:
            raise invalid_request(
                "A 'compaction_trigger' item must be the final input item.", f"input[{index}].type", "invalid_value"
            )
    if items and isinstance(items[-1], CompactionTrigger):
        return items[:-1], True
    return items, False


def truncation_budget(request: CreateResponse, route: Route) -> int | None:
    """The prompt tokens a ``truncation: "auto"`` request may use (its route's context window,
    less the generation prompt and ``max_output_tokens`` when set); ``None`` without truncation."""
    if request.truncation != "auto" or route.renderer is None:
        return None
    return route.window - len(route.renderer.generation_prompt) - (request.max_output_tokens or 0)


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    """A turn's input as validation and the blocking hooks let it through."""

    items: list[Item]
    #: The calls left open once the new items are in (validation checked their outputs).
    open_calls: dict[str, str]
    hook_state: dict[str, Any]
    #: The input ended with a ``compaction_trigger`` item: compact now.
    triggered: bool = False
    #: ``context_management``'s token threshold for an automatic compaction (``None``: none).
    threshold: int | None = None
