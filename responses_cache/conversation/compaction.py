"""Compaction: a conversation replaced by a summary the model wrote of it.

``POST /v1/responses/compact`` and ``context_management: [{"type": "compaction", …}]`` ask the
engine for a summary of the conversation — an ordinary generation through the route's
:class:`~responses_cache.backends.base.Backend`, the conversation followed by one user message,
:data:`SUMMARY_PROMPT` — and hand the client a ``compaction`` item whose ``encrypted_content``
is that summary sealed (:mod:`responses_cache.conversation.sealing`, purpose ``"compaction"``) for the
request's tenant, with an expiry. The client cannot read or alter it; when it sends the item back
as input, the server opens it (:func:`open_items`) and the model sees the summary as a user
message starting with :data:`SUMMARY_PREFIX` (:func:`expanded`), in the item's place.

On the wire (and in the store) a compaction item is a
:class:`~responses_cache.protocol.items.CompactionItem`, exactly the SDK's
``ResponseCompactionItem`` (``type``, ``id``, ``encrypted_content``). Opened, it is a
:class:`Compaction`, which also holds the summary — never encoded, so the summary never reaches
a client or the store.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import msgspec

from ..protocol.errors import ResponsesError, invalid_request
from ..protocol.ids import new_id
from ..protocol.items import CompactionItem, HostedItem, Item, Message
from . import Conversation
from .sealing import Sealer, SealError

PURPOSE = "compaction"

#: The user message that asks the engine for the summary (appended to the conversation).
SUMMARY_PROMPT = (
    "You are about to run out of context. Write a handoff summary of the conversation so far for "
    "yourself, so that you can continue the task from it alone: the user's goal and constraints, "
    "what has been done (commands run, files changed, results), decisions taken and why, what is "
    "left to do, and anything you must not forget. Be concise and factual; do not call tools."
)

#: How the opened summary is shown to the model, in the compaction item's place (a user message).
SUMMARY_PREFIX = "Summary of the earlier conversation, written by you when the context was compacted:\n\n"

#: How long a compaction item opens after it was made (``ServerConfig.compaction_ttl_s``).
DEFAULT_TTL_S = 30 * 24 * 3600.0


class _Sealed(msgspec.Struct, array_like=True):
    summary: str
    #: Unix seconds after which the item is refused.
    expires_at: float
    #: Made by automatic compaction (``context_management``): it replaces everything before it.
    replaces_history: bool = False


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(_Sealed)
_json = msgspec.json.Encoder()


class Compaction(HostedItem):
    """A ``compaction`` item, opened: its wire form (``raw``, canonical JSON of the SDK's fields)
    and the summary it seals (server-side only)."""

    __slots__ = ("created_by", "encrypted_content", "replaces_history", "summary")

    def __init__(
        self,
        encrypted_content: str,
        summary: str,
        id: str | None = None,
        created_by: str | None = None,
        *,
        replaces_history: bool = False,
    ) -> None:
        raw = _json.encode(CompactionItem(encrypted_content, id, created_by))
        super().__init__("compaction", raw, id)
        self.created_by = created_by
        self.encrypted_content = encrypted_content
        self.summary = summary
        #: Made by automatic compaction: the conversation before it is dropped (see
        #: :func:`history_start`).
        self.replaces_history = replaces_history

    def __repr__(self) -> str:
        return f"Compaction(id={self.id!r})"

    def wire(self) -> CompactionItem:
        """The item as the wire and the store carry it (the summary left out)."""
        return CompactionItem(self.encrypted_content, self.id, self.created_by)


def seal(
    sealer: Sealer,
    tenant: str,
    summary: str,
    *,
    ttl_s: float = DEFAULT_TTL_S,
    now: float | None = None,
    item_id: str | None = None,
    replaces_history: bool = False,
) -> Compaction:
    """A new compaction item holding ``summary``, sealed for ``tenant`` until ``now + ttl_s``."""
    at = time.time() if now is None else now
    blob = sealer.seal(tenant, PURPOSE, _encode(_Sealed(summary, at + ttl_s, replaces_history)))
    return Compaction(blob, summary, item_id or new_id("cmp"), replaces_history=replaces_history)


def open_items(sealer: Sealer | None, tenant: str, items: list[Item], *, now: float | None = None) -> list[Item]:
    """``items`` with every ``compaction`` item opened into a :class:`Compaction`.

    A blob that does not open for ``tenant`` (altered, cut, another key or tenant) or that has
    expired is 400 ``invalid_encrypted_content`` naming the item; without a sealing key the
    server cannot open any, which is 400 ``unsupported_value``. ``now=None`` checks against the
    clock; a negative ``now`` skips the expiry (a conversation the server itself stored)."""
    out = items
    at = time.time() if now is None else now
    for index, item in enumerate(items):
        if not isinstance(item, CompactionItem):
            continue
        param = f"input[{index}].encrypted_content"
        if sealer is None:
            raise invalid_request(
                "Compaction items are not available on this server (it has no sealing key).", param, "unsupported_value"
            )
        opened = _open(sealer, tenant, item, param, at)
        if out is items:
            out = list(items)
        out[index] = opened
    return out


def _open(sealer: Sealer, tenant: str, item: CompactionItem, param: str, now: float) -> Compaction:
    blob = item.encrypted_content
    name = f"for item {item.id} " if item.id else ""
    try:
        sealed = _decode.decode(sealer.open(tenant, PURPOSE, blob))
    except (SealError, msgspec.DecodeError, msgspec.ValidationError):
        raise _invalid(f"The encrypted content {name}could not be verified.", param) from None
    if now >= 0 and sealed.expires_at < now:
        raise _invalid(f"The encrypted content {name}has expired; compact the conversation again.", param)
    return Compaction(blob, sealed.summary, item.id, item.created_by, replaces_history=sealed.replaces_history)


def _invalid(message: str, param: str) -> ResponsesError:
    return ResponsesError(message, code="invalid_encrypted_content", param=param)


def expanded(item: Item) -> Item:
    """What the model sees of ``item``: a compaction item's summary as a user message."""
    if isinstance(item, Compaction):
        return Message(role="user", content=SUMMARY_PREFIX + item.summary)
    return item


def expand(items: Iterable[Item]) -> list[Item]:
    """:func:`expanded` of each item."""
    return [expanded(i) for i in items]


def replaces_history(item: Item) -> bool:
    """Was ``item`` made by automatic compaction (the conversation before it is dropped)?"""
    return isinstance(item, Compaction) and item.replaces_history


def history_start(items: Sequence[Item]) -> int:
    """Where the conversation the model sees starts in ``items``: at the latest item made by
    automatic compaction (it summarizes everything before it), else at 0. So a client that drops
    the items before that compaction item, as the Responses API advises, and one that keeps
    sending them get the same prompt."""
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if isinstance(item, Compaction) and item.replaces_history:
            return index
    return 0


def has_compaction(items: Iterable[Item]) -> bool:
    return any(isinstance(i, Compaction) for i in items)


def expand_conversation(conversation: Conversation) -> Conversation:
    """``conversation`` as the model sees it (a new one only when it holds a compaction item)."""
    items = conversation.items()
    if not has_compaction(items):
        return conversation
    return Conversation(None, expand(items))


def user_messages(items: Sequence[Item]) -> list[Message]:
    """The user messages of a conversation (what a compacted conversation keeps besides the summary)."""
    return [i for i in items if isinstance(i, Message) and i.role == "user"]
