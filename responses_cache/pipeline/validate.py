"""The *validate* stage: checks a turn's new items against the state carried from the parent.

Work is proportional to the new items: open function calls are carried in the parent's state, so
a ``function_call_output`` is checked without looking at the history. ``items_checked`` and
``bytes_checked`` count the work for tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..protocol.errors import ResponsesError, invalid_request
from ..protocol.items import FunctionCall, FunctionCallOutput, Item, has_media
from ..state import open_calls_after


@dataclass(frozen=True, slots=True)
class Limits:
    max_items_per_turn: int = 16_384
    max_item_bytes: int = 10 * 1024 * 1024


class Validator:
    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.items_checked = 0

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
            if isinstance(item, FunctionCallOutput):
                if check_calls and item.call_id not in pending:
                    raise invalid_request(
                        f"No tool call found for function call output with call_id {item.call_id}.",
                        f"input[{index}].call_id",
                        "invalid_function_call_output",
                    )
                pending.pop(item.call_id, None)
            elif isinstance(item, FunctionCall):
                pending[item.call_id] = item.name
            if not accepts_media and has_media(item):
                raise ResponsesError(
                    "Image and file inputs are not supported by this model.",
                    code="unsupported_value",
                    param=f"input[{index}].content",
                )
        return pending


def calls_after(open_calls: Mapping[str, str], items: list[Item]) -> dict[str, str]:
    return open_calls_after(open_calls, items)
