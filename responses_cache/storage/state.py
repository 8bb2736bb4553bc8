"""What a continuation needs from the response it continues: :class:`ResponseState`.

A state is immutable once its response has finished. A child shares its parent's conversation
nodes and token-log segments, so a fork or a continuation never copies the history.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..conversation import EMPTY, Conversation
from ..protocol.codec import encode
from ..protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    Item,
)
from ..protocol.response import Response
from ..protocol.tools import ToolSet

if TYPE_CHECKING:
    from ..backends.routing import Route
    from ..tokens.base import Renderer
    from ..tokens.log import TokenLog


@dataclass(frozen=True, slots=True)
class ResponseState:
    response: Response
    tenant: str
    lane: str | None
    conversation: Conversation
    instructions: str | None
    tools: ToolSet
    #: Renderer fingerprint (template, encoding, instructions, tools) the token log was built with.
    fingerprint: bytes | None
    token_log: TokenLog | None
    route: Route | None
    #: Calls left open by this response's output (``call_id`` → name), for validating outputs.
    open_calls: Mapping[str, str] = field(default_factory=dict)
    #: State each validation/safety hook carried forward, by hook name.
    hook_state: Mapping[str, Any] = field(default_factory=dict)
    #: Engine-affinity key of the conversation (its first response's id, or its prompt_cache_key).
    conversation_key: str = ""
    #: Approximate bytes of the items of the whole conversation (for cache budgets).
    total_bytes: int = 0
    #: After ``truncation: "auto"`` cut the conversation: where the kept items start in the
    #: conversation as the client holds it (``client_offset``), and how many system/developer
    #: messages from before that point the conversation holds ahead of them (``kept_ahead``), so
    #: a client resending its whole input is matched from there. Both 0 otherwise.
    client_offset: int = 0
    kept_ahead: int = 0

    @property
    def id(self) -> str:
        return self.response.id

    @property
    def store(self) -> bool:
        return self.response.store


def open_calls_after(previous: Mapping[str, str], items: Sequence[Item]) -> dict[str, str]:
    """Calls still unanswered after ``items`` (O(len(items)), carried from the parent)."""
    calls = dict(previous)
    for item in items:
        if isinstance(item, (FunctionCall, CustomToolCall)):
            calls[item.call_id] = item.name
        elif isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
            calls.pop(item.call_id, None)
    return calls


def rebased(
    state: ResponseState, items: Sequence[Item], count: int, identical: int, renderer: Renderer | None
) -> ResponseState:
    """``state`` cut to its first ``count`` items and holding the client's ``items[:count]``.

    The caller has checked that ``items[:count]`` render exactly like the cached items (equal
    render keys) and that ``identical`` of them are equal field for field. The token log is
    rewound to ``count`` items (shared, nothing re-tokenized); the conversation shares the cached
    nodes that hold only identical items and takes the client's own items after them, so what is
    stored, hydrated or handed to a message-based backend is what the client sent. Hook state is
    dropped unless every item is identical (the hooks then re-read the history once).
    """
    if count == identical == state.conversation.count:
        return state
    node: Conversation | None = state.conversation
    while node is not None and node.count > identical:
        node = node.parent
    base = node if node is not None else EMPTY
    conversation = base.extend(items[base.count : count])
    whole = count == state.conversation.count
    log = state.token_log
    if log is not None and not whole:
        # Cut by the route's renderer; without one the cached log cannot be reused (full render).
        log = _rewound(log, count, renderer)
    return dataclasses.replace(
        state,
        conversation=conversation,
        token_log=log,
        fingerprint=state.fingerprint if log is not None else None,
        open_calls=state.open_calls if whole else open_calls_after({}, items[:count]),
        hook_state={},
        total_bytes=state.total_bytes if whole else sum(len(encode(i)) for i in items[:count]),
    )


def _rewound(log: TokenLog, count: int, renderer: Renderer | None) -> TokenLog | None:
    """``log`` cut to ``count`` items by the route's renderer; ``None`` (a full render follows)
    without one, or when the log was rendered with other options."""
    if renderer is None:
        return None
    try:
        return renderer.rewind(log, count)
    except ValueError:
        return None
