"""The *validate* stage: checks a turn's new items against the state carried from the parent.

Work is proportional to the new items: open function calls are carried in the parent's state, so
a ``function_call_output`` is checked without looking at the history. ``items_checked`` and
``bytes_checked`` count the work for tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
    has_media,
    text_of,
)


@dataclass(frozen=True, slots=True)
class Limits:
    max_items_per_turn: int = 16_384
    max_item_bytes: int = 10 * 1024 * 1024


class Validator:
    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.items_checked = 0
        self.bytes_checked = 0

    def __call__(
        self, items: list[Item], open_calls: Mapping[str, str], *, accepts_media: bool, check_calls: bool = True
    ) -> dict[str, str]:
        """Validate ``items``; return the calls left open after them. ``check_calls=False`` when
        the parent is not known here (delegated to a backend's own store)."""
        if len(items) > self.limits.max_items_per_turn:
            raise invalid_request(
                f"Too many input items: {len(items)} (at most {self.limits.max_items_per_turn}).",
                "input",
                "too_many_items",
            )
        pending = dict(open_calls)
        for index, item in enumerate(items):
            self.items_checked += 1
            if isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
                if check_calls and item.call_id not in pending:
                    kind = "function" if isinstance(item, FunctionCallOutput) else "custom tool"
                    raise invalid_request(
                        f"No tool call found for {kind} call output with call_id {item.call_id}.",
                        f"input[{index}].call_id",
                        "invalid_function_call_output",
                    )
                pending.pop(item.call_id, None)
            elif isinstance(item, (FunctionCall, CustomToolCall)):
                pending[item.call_id] = item.name
            size = _text_bytes(item)
            self.bytes_checked += size
            if size > self.limits.max_item_bytes:
                raise invalid_request(
                    f"Input item {index} is {size} bytes; at most {self.limits.max_item_bytes} bytes are allowed per item.",
                    f"input[{index}]",
                    "string_above_max_length",
                )
            if not accepts_media and has_media(item):
                raise ResponsesError(
                    "Image and file inputs are not supported by this model.",
                    code="unsupported_value",
                    param=f"input[{index}].content",
                )
        return pending


def _text_bytes(item: Item) -> int:
    """UTF-8 size of the text an item carries (what the renderer will tokenize)."""
    if isinstance(item, Message):
        text = text_of(item.content)
    elif isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
        text = item.output if isinstance(item.output, str) else text_of(item.output)
    elif isinstance(item, FunctionCall):
        text = item.arguments
    elif isinstance(item, CustomToolCall):
        text = item.input
    elif isinstance(item, HostedItem):
        return len(item.raw)
    elif isinstance(item, Reasoning):
        text = "".join(p.text for p in item.content or ()) + "".join(p.text for p in item.summary)
        text += item.encrypted_content or ""
    else:
        return 0
    return len(text.encode())
