"""The one definition of "renders the same": :func:`render_key`.

Two items with equal render keys render to the same tokens under every renderer of this package
(given equal items before them). The key is built generically from *every* field of the item
except the few that no renderer reads, so a field added to an item type is part of the key
without anyone having to remember it; only these normalizations are made:

* ``id`` and ``status`` of the item types listed in :data:`IGNORED_FIELDS` are left out (no
  template renders them). An item type not listed there is keyed on every field, ids included
  (an ``item_reference``'s ``id`` *is* its content), until someone lists it;
* a text content part is its text: ``"hi"``, ``[input_text "hi"]`` and ``[output_text "hi"]``
  (whatever its ``annotations`` and ``logprobs``) are the same single part. Part *boundaries*
  are kept: ``["hello wor", "ld"]`` is not ``"hello world"`` (harmony encodes each part on its
  own).

Everything else (role, ``phase``, call ids, names, namespaces, argument bytes, each reasoning
encoding — ``content``, ``summary``, ``encrypted_content`` — media parts, and any field of an
item type this module does not know) is compared as sent. The key is deliberately on the safe
side: equal keys imply equal tokens; unequal keys may still render alike (a ``refusal`` part and
a text part, say), which only costs a re-render.

Used by the connection cache's full-input matcher (:func:`reusable_prefix`: how far a resend
equals the cached conversation), by :mod:`responses_cache.testing` (``context_of``) and by the fidelity tests.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    HostedItem,
    InputText,
    Item,
    Message,
    OutputText,
    Reasoning,
)

if TYPE_CHECKING:
    from .log import TokenLog

_OWN_ID = frozenset({"id", "status"})
#: Per item type, the fields no renderer reads (the item's own id and status).
IGNORED_FIELDS: dict[type, frozenset[str]] = {
    Message: _OWN_ID,
    FunctionCall: _OWN_ID,
    FunctionCallOutput: _OWN_ID,
    Reasoning: _OWN_ID,
    CustomToolCall: _OWN_ID,
    CustomToolCallOutput: _OWN_ID,
}
#: Fields that hold ``str | list[ContentPart]`` (a string is one text part).
_CONTENT_FIELDS = frozenset({"content", "output"})
_TEXT = "text"


def render_key(item: Item) -> tuple[Hashable, ...]:
    """What a renderer consumes of ``item``, as a hashable tuple (see the module docstring)."""
    if isinstance(item, HostedItem):
        return (item.type, item.raw)  # carried byte for byte: its JSON is what is rendered
    out: list[Hashable] = [_tag(item)]
    ignored = IGNORED_FIELDS.get(type(item), frozenset())
    for name in item.__struct_fields__:
        if name in ignored:
            continue
        value = getattr(item, name)
        if name in _CONTENT_FIELDS and isinstance(value, str):
            out.append(((_TEXT, value),))
        else:
            out.append(_value(value))
    return tuple(out)


def renders_same(a: Item, b: Item) -> bool:
    """True when ``a`` and ``b`` have equal render keys (so they render to the same tokens)."""
    return a is b or render_key(a) == render_key(b)


def reusable_prefix(cached: Iterable[Item], items: Sequence[Item], log: TokenLog | None) -> tuple[int, int]:
    """How much of a cached conversation (rendered as ``log``, if any) a resent input reuses:
    ``(count, identical)``. ``count``: leading items of ``items`` that render exactly like the
    cached ones, stopping at the first that does not and never cutting inside an unsplittable
    sampled turn of ``log``; ``identical`` (≤ ``count``): how many of them are equal to the cached
    items field for field (ids and statuses too)."""
    count = identical = 0
    for mine, theirs in zip(cached, items, strict=False):
        if mine is theirs or mine == theirs:
            if identical == count:
                identical += 1
        elif render_key(mine) != render_key(theirs):
            break
        count += 1
    while log is not None and count > 0 and not log.splits_at(count):
        count -= 1
    return count, min(identical, count)


def _tag(struct: msgspec.Struct) -> Hashable:
    tag: Hashable = struct.__struct_config__.tag
    return tag if tag is not None else type(struct).__name__


def _value(value: Any) -> Hashable:
    if isinstance(value, (InputText, OutputText)):
        return (_TEXT, value.text)  # annotations and logprobs are never rendered
    if isinstance(value, msgspec.Struct):
        return (_tag(value), *(_value(getattr(value, f)) for f in value.__struct_fields__))
    if isinstance(value, (list, tuple)):
        return tuple(_value(v) for v in value)
    if isinstance(value, dict):
        return msgspec.json.encode(value)
    if isinstance(value, msgspec.Raw):
        return bytes(value)
    return value  # type: ignore[no-any-return]
