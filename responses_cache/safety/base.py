"""Shared machinery of the reference safety hooks: what text an item exposes, and the carried state.

Every reference hook is a pure function of the conversation's text: a hook's verdict for a turn
is the verdict it would give on the whole history. Incrementally, each hook scans only the new
items and folds the result into a small :class:`ScanState` carried to the child response.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import msgspec

from ..protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Item,
    Message,
    OutputText,
    Reasoning,
    content_texts,
)

#: Which texts a hook looks at: ``user`` (user messages), ``system`` (system/developer messages),
#: ``assistant`` (assistant messages), ``tool_output`` (function call outputs), ``tool_call``
#: (function call arguments), ``reasoning`` (reasoning summaries and text).
Scope = Literal["user", "system", "assistant", "tool_output", "tool_call", "reasoning"]
DEFAULT_SCOPE: tuple[Scope, ...] = ("user", "tool_output")
_Rewrite = Callable[[str], str]



def texts_of(item: Item, scope: Iterable[Scope]) -> list[str]:
    """The texts of ``item`` that fall in ``scope`` (empty when it is out of scope)."""
    kinds = set(scope)
    if isinstance(item, Message):
        if item.role == "user":
            wanted = "user" in kinds
        elif item.role == "assistant":
            wanted = "assistant" in kinds
        else:
            wanted = "system" in kinds
        return content_texts(item.content) if wanted else []
    if isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
        return content_texts(item.output) if "tool_output" in kinds else []
    if isinstance(item, FunctionCall):
        return [item.arguments] if "tool_call" in kinds else []
    if isinstance(item, CustomToolCall):
        return [item.input] if "tool_call" in kinds else []
    if isinstance(item, Reasoning):
        if "reasoning" not in kinds:
            return []
        return [s.text for s in item.summary] + [c.text for c in item.content or ()]
    return []


def scanned_bytes(items: Iterable[Item], scope: Iterable[Scope]) -> int:
    """UTF-8 bytes of the in-scope text of ``items`` (what a hook scans for them)."""
    kinds = tuple(scope)
    return sum(len(t.encode()) for item in items for t in texts_of(item, kinds))


def rewrite_texts(item: Item, scope: Iterable[Scope], fn: _Rewrite) -> Item:
    """``item`` with ``fn`` applied to each in-scope text (the same object when nothing changed)."""
    kinds = set(scope)
    if isinstance(item, Message):
        role_kind = (
            "user" if item.role == "user" else "assistant" if item.role == "assistant" else "system"
        )
        if role_kind not in kinds:
            return item
        content = _rewrite_content(item.content, fn)
        return item if content is item.content else msgspec.structs.replace(item, content=content)
    if isinstance(item, (FunctionCallOutput, CustomToolCallOutput)) and "tool_output" in kinds:
        output = _rewrite_content(item.output, fn)
        return item if output is item.output else msgspec.structs.replace(item, output=output)
    if isinstance(item, CustomToolCall) and "tool_call" in kinds:
        text = fn(item.input)
        return item if text == item.input else msgspec.structs.replace(item, input=text)
    if isinstance(item, FunctionCall) and "tool_call" in kinds:
        arguments = fn(item.arguments)
        return (
            item
            if arguments == item.arguments
            else msgspec.structs.replace(item, arguments=arguments)
        )
    return item


def _rewrite_content(content: object, fn: _Rewrite) -> object:
    if isinstance(content, str):
        new = fn(content)
        return content if new == content else new
    assert isinstance(content, list)
    changed = False
    parts: list[object] = []
    for part in content:
        if isinstance(part, InputText):
            new = fn(part.text)
            if new != part.text:
                part, changed = InputText(new), True
        elif isinstance(part, OutputText):
            new = fn(part.text)
            if new != part.text:
                part, changed = msgspec.structs.replace(part, text=new), True
        parts.append(part)
    return parts if changed else content


@dataclass(frozen=True, slots=True)
class ScanState:
    """What a reference hook carries from a response to its child.

    ``bytes_scanned``: in-scope bytes of the whole conversation so far; ``hits``: matches so far;
    ``first``: what the first flagged match was (kept so the verdict message is history-stable);
    ``flagged``: whether the conversation so far is flagged (sticky: a flagged conversation that
    is continued anyway, e.g. after a late flag, stays flagged).
    """

    bytes_scanned: int = 0
    hits: int = 0
    first: str | None = None
    flagged: bool = False

    def advance(self, scanned: int, hits: int, first: str | None, flagged: bool) -> ScanState:
        return dataclasses.replace(
            self,
            bytes_scanned=self.bytes_scanned + scanned,
            hits=self.hits + hits,
            first=self.first if self.first is not None else first,
            flagged=self.flagged or flagged,
        )


def carried(state: object) -> ScanState:
    """The carried state, or a fresh one (``None``, or a foreign value, starts over)."""
    return state if isinstance(state, ScanState) else ScanState()
