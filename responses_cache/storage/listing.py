"""``GET /v1/responses/{id}/input_items``: a stored response's input items as a cursor page.

The items are those the response was generated from, oldest first: every earlier response of
its stored chain (input and output), then its own input — the conversation the model saw, as
the client sent it (hosted-tool items byte for byte, item references already replaced by the
items they named). If an earlier link of the chain has been deleted or has expired, only the
response's own input items are listed.

Every item on the page has an ``id`` (the SDK's item types require one): an item the client
sent without one is named by its place in the chain (``msg_…``, ``fco_…``), the same name on
every call, so ``after`` pages through a listing reliably. Those names are for paging only;
``item_reference`` resolves the ids the client or the server gave the items.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from ..protocol.codec import encode
from ..protocol.errors import ResponsesError, invalid_request
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
)
from .store import StoredResponse

#: What ``include`` may name (the Responses API's ``ResponseIncludable``); the stored items
#: already carry everything these would add, so they change nothing here.
INCLUDABLE = frozenset(
    {
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
    }
)
DEFAULT_LIMIT = 20
MAX_LIMIT = 100

_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
}
_dict = msgspec.json.Decoder(dict[str, Any])


@dataclass(frozen=True, slots=True)
class PageQuery:
    after: str | None = None
    limit: int = DEFAULT_LIMIT
    order: Literal["asc", "desc"] = "desc"
    include: tuple[str, ...] = ()


def parse_query(params: Mapping[str, str], include: Sequence[str]) -> PageQuery:
    """The query string of a listing, checked: a bad value is a 400 naming the parameter."""
    raw_limit = params.get("limit")
    limit = DEFAULT_LIMIT
    if raw_limit is not None:
        if not raw_limit.strip().lstrip("-").isdigit():
            raise invalid_request(f"Invalid type for 'limit': expected an integer, but got '{raw_limit}'.", "limit", "invalid_type")
        limit = int(raw_limit)
        if not 1 <= limit <= MAX_LIMIT:
            raise invalid_request(
                f"Invalid 'limit': integer must be between 1 and {MAX_LIMIT}, but got {limit}.", "limit", "invalid_value"
            )
    order = params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request(f"Invalid value for 'order': '{order}'. Supported values are: 'asc' and 'desc'.", "order", "invalid_value")
    for value in include:
        if value not in INCLUDABLE:
            raise invalid_request(
                f"Invalid value for 'include': '{value}'. Supported values are: {', '.join(sorted(INCLUDABLE))}.",
                "include",
                "invalid_value",
            )
    after = params.get("after") or None
    return PageQuery(after=after, limit=limit, order="asc" if order == "asc" else "desc", include=tuple(include))


def context_items(chain: Sequence[StoredResponse]) -> list[tuple[str, int, Item]]:
    """The items a response was generated from, oldest first, each with the id of the stored
    response holding it and its place there: ``chain`` is the stored chain ending at the
    response (oldest first)."""
    out: list[tuple[str, int, Item]] = []
    for link in chain[:-1]:
        for i, item in enumerate((*link.input_items, *link.response.output)):
            out.append((link.id, i, item))
    last = chain[-1]
    out += [(last.id, i, item) for i, item in enumerate(last.input_items)]
    return out


def page(items: Sequence[tuple[str, int, Item]], query: PageQuery) -> dict[str, Any]:
    """One page of ``items`` (oldest first) as the Responses API's ``list`` object."""
    listed = [wire_item(item, holder, index) for holder, index, item in items]
    if query.order == "desc":
        listed.reverse()
    start = 0
    if query.after is not None:
        position = next((k for k, d in enumerate(listed) if d["id"] == query.after), None)
        if position is None:
            raise invalid_request(
                f"No input item with id '{query.after}' in this response's input items.", "after", "invalid_value"
            )
        start = position + 1
    data = listed[start : start + query.limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + query.limit < len(listed),
    }


def listing_id(item: Item, holder: str, index: int) -> str:
    """The item's own id, or a stable name for one sent without an id."""
    own = item.id if isinstance(item, HostedItem) else getattr(item, "id", None)
    if own:
        return str(own)
    kind = item.type if isinstance(item, HostedItem) else str(type(item).__struct_config__.tag)
    digest = hashlib.sha256(f"{holder}/{index}".encode()).hexdigest()[:32]
    return f"{_PREFIX.get(kind, 'item')}_{digest}"


def wire_item(item: Item, holder: str, index: int) -> dict[str, Any]:
    """An item as the listing shows it: the shape of the SDK's ``ResponseItem`` (an id and a
    status on every item, message content as a list of parts)."""
    item_id = listing_id(item, holder, index)
    if isinstance(item, HostedItem):
        data = _dict.decode(item.raw)
        data.setdefault("id", item_id)
        return data
    data = _dict.decode(encode(item))
    data["id"] = item_id
    if isinstance(item, Message):
        data["content"] = _message_content(item)
        data.setdefault("status", "completed")
    elif isinstance(item, (FunctionCall, FunctionCallOutput, CustomToolCall, CustomToolCallOutput)):
        data.setdefault("status", "completed")
    return data


def _message_content(message: Message) -> list[dict[str, Any]]:
    """A message's content as parts: input messages hold ``input_text`` (and media) parts, the
    assistant's ``output_text`` and ``refusal`` parts."""
    content = message.content
    assistant = message.role == "assistant"
    if isinstance(content, str):
        part: Any = OutputText(text=content) if assistant else InputText(text=content)
        return [_dict.decode(encode(part))]
    parts: list[dict[str, Any]] = []
    for p in content:
        if assistant and isinstance(p, InputText):
            p = OutputText(text=p.text)
        parts.append(_dict.decode(encode(p)))
    return parts


def not_found(response_id: str) -> ResponsesError:
    return ResponsesError(
        f"Response with id '{response_id}' not found.", status=404, code="response_not_found", param="response_id"
    )
