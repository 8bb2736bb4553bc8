"""The ``POST /v1/responses`` body, which is also the flat body of a WebSocket ``response.create``.

Every documented field is accepted and unknown top-level fields are ignored. ``input`` and
``tools`` stay as raw JSON (``msgspec.Raw``) at first: tools are fingerprinted by their bytes and
parsed once per distinct list, and input items are decoded one by one so that an error names the
exact item (``input[3].call_id``).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .errors import ResponsesError, from_validation_error, invalid_request
from .items import (
    HOSTED_ITEM_TYPES,
    HOSTED_ITEMS,
    ITEM_TYPES,
    HostedItem,
    Item,
    ItemReference,
    Message,
    WireItem,
)

_RAW_EMPTY = msgspec.Raw(b"")


def _raw() -> msgspec.Raw:
    return _RAW_EMPTY


class CreateResponse(msgspec.Struct, kw_only=True):
    model: str | None = None
    input: msgspec.Raw = msgspec.field(default_factory=_raw)
    instructions: str | None = None
    tools: msgspec.Raw = msgspec.field(default_factory=_raw)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    prompt: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    truncation: str | None = None
    user: str | None = None
    context_management: list[dict[str, Any]] | None = None
    conversation: str | dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    access_programs: dict[str, Any] | None = None
    # WebSocket-only fields (``type`` is the client event tag).
    type: Literal["response.create"] | None = None
    stream_id: str | None = None
    generate: bool = True
    client_metadata: dict[str, str] | None = None


_create_decoder = msgspec.json.Decoder(CreateResponse)
_raw_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_item_decoder: msgspec.json.Decoder[WireItem] = msgspec.json.Decoder(WireItem)  # type: ignore[arg-type]
_reference_decoder = msgspec.json.Decoder(ItemReference)
_message_decoder = msgspec.json.Decoder(Message)
_type_probe = msgspec.json.Decoder(dict[str, Any])


def decode_create(body: bytes | str) -> CreateResponse:
    """Decode a create body; raises :class:`ResponsesError` (400) naming the bad field."""
    try:
        request = _create_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise from_validation_error(exc) from None
    except msgspec.DecodeError:
        raise invalid_request(
            "We could not parse the JSON body of your request. The body must be a JSON object.",
            None,
            "invalid_json",
        ) from None
    if request.model is None or request.model == "":
        raise invalid_request("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    return request


def decode_input(raw: msgspec.Raw | bytes) -> list[Item]:
    """Decode ``input``: a string (one user message) or an array of items."""
    data = bytes(raw)
    if not data or data == b"null":
        return []
    if data[:1] == b'"':
        return [Message(role="user", content=msgspec.json.decode(data, type=str))]
    try:
        elements = _raw_list_decoder.decode(data)
    except msgspec.ValidationError:
        raise invalid_request(
            "Invalid type for 'input': expected a string or an array of input items.", "input", "invalid_type"
        ) from None
    return [decode_item(element, i) for i, element in enumerate(elements)]


def decode_item(element: msgspec.Raw | bytes, index: int) -> Item:
    """Decode one input item. A message may omit ``type`` (the "easy" input message form), and so
    may an item reference (``{"id": "msg_…"}``). Hosted-tool items are kept as sent."""
    try:
        return _item_decoder.decode(element)
    except msgspec.ValidationError as exc:
        head = _probe(element, index)
        kind = head.get("type")
        if kind is None and "role" in head:
            try:
                return _message_decoder.decode(_with_type(element))
            except msgspec.ValidationError as inner:
                raise from_validation_error(inner, f"input[{index}]") from None
        if kind is None and "id" in head:
            try:
                return _reference_decoder.decode(_with_type(element, b"item_reference"))
            except msgspec.ValidationError as inner:
                raise from_validation_error(inner, f"input[{index}]") from None
        if isinstance(kind, str) and kind in HOSTED_ITEM_TYPES:
            return _hosted(kind, head, element, index)
        if isinstance(kind, str) and kind not in ITEM_TYPES:
            raise unsupported_item(kind, index) from None
        raise from_validation_error(exc, f"input[{index}]") from None


def _hosted(kind: str, head: dict[str, Any], element: msgspec.Raw | bytes, index: int) -> HostedItem:
    for field in HOSTED_ITEMS[kind]:
        if field not in head:
            raise invalid_request(
                f"Missing required parameter: 'input[{index}].{field}'.",
                f"input[{index}].{field}",
                "missing_required_parameter",
            )
    item_id, call_id = head.get("id"), head.get("call_id")
    for name, value in (("id", item_id), ("call_id", call_id)):
        if value is not None and not isinstance(value, str):
            raise invalid_request(
                f"Invalid type for 'input[{index}].{name}': expected a string.", f"input[{index}].{name}", "invalid_type"
            )
    return HostedItem(kind, bytes(element), item_id, call_id)


def unsupported_item(kind: str, index: int) -> ResponsesError:
    supported = sorted(ITEM_TYPES | HOSTED_ITEM_TYPES)
    listed = ", ".join(f"'{t}'" for t in supported[:-1]) + f" and '{supported[-1]}'"
    return invalid_request(
        f"Invalid value: '{kind}'. Supported values are: {listed}.",
        f"input[{index}].type",
        "invalid_value",
    )


def _probe(element: msgspec.Raw | bytes, index: int) -> dict[str, Any]:
    try:
        head = _type_probe.decode(element)
    except msgspec.ValidationError:
        raise invalid_request(
            f"Invalid type for 'input[{index}]': expected an object.", f"input[{index}]", "invalid_type"
        ) from None
    return head


def _with_type(element: msgspec.Raw | bytes, tag: bytes = b"message") -> bytes:
    data = bytes(element).lstrip()
    head = b'{"type":"' + tag + b'"'
    return head + b"," + data[1:] if data[1:].lstrip()[:1] != b"}" else head + b"}"
