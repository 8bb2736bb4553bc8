"""The ``POST /v1/responses`` body, which is also the flat body of a WebSocket ``response.create``.

Every documented field is accepted and unknown top-level fields are ignored. ``input`` and
``tools`` stay as raw JSON (``msgspec.Raw``) at first: tools are fingerprinted by their bytes and
parsed once per distinct list, and input items are decoded one by one so that an error names the
exact item (``input[3].call_id``).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .codec import check_depth, decode, not_json, too_deep
from .errors import ResponsesError, from_validation_error, invalid_request
from .items import (
    HOSTED_ITEM_TYPES,
    HOSTED_ITEMS,
    ITEM_TYPES,
    FunctionCallOutput,
    HostedItem,
    Item,
    ItemReference,
    Message,
    OutputText,
    WireItem,
)

_RAW_EMPTY = msgspec.Raw(b"")
#: An absent ``input`` or ``tools`` (what a request holds once they are decoded).
RAW_EMPTY = _RAW_EMPTY


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
    #: Scheduling priority, an extension vLLM's own API also takes: lower runs earlier. Passed to
    #: engines that take it, and orders a tenant's turns waiting for an engine slot.
    priority: int | None = None
    # WebSocket-only fields (``type`` is the client event tag).
    type: Literal["response.create"] | None = None
    stream_id: str | None = None
    generate: bool = True
    #: Keep the response open across function calls for ``response.append`` (an opt-in extension).
    append: bool = False
    client_metadata: dict[str, str] | None = None


_create_decoder = msgspec.json.Decoder(CreateResponse)
_raw_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_item_decoder: msgspec.json.Decoder[WireItem] = msgspec.json.Decoder(WireItem)  # type: ignore[arg-type]
_reference_decoder = msgspec.json.Decoder(ItemReference)
_message_decoder = msgspec.json.Decoder(Message)
_type_probe = msgspec.json.Decoder(dict[str, Any])
_str_decoder = msgspec.json.Decoder(str)

#: The fields the wire type leaves free-form (``Any`` inside): held to ``MAX_DEPTH`` levels.
_FREE_FORM = (
    "tool_choice", "reasoning", "text", "prompt", "prompt_cache_options", "context_management",
    "conversation", "moderation", "stream_options", "access_programs",
)


def decode_create(body: bytes | str) -> CreateResponse:
    """Decode a create body; raises :class:`ResponsesError` (400) naming the bad field."""
    request = decode(_create_decoder, body)
    if request.model is None or request.model == "":
        raise invalid_request("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    for name in _FREE_FORM:
        check_depth(getattr(request, name), name)
    return request


def decode_count(body: bytes | str) -> CreateResponse:
    """Decode a ``POST /v1/responses/input_tokens`` body: a create body whose ``model`` may be
    left out (the server's default model then)."""
    request = decode(_create_decoder, body)
    for name in _FREE_FORM:
        check_depth(getattr(request, name), name)
    return request


def decode_input(raw: msgspec.Raw | bytes) -> list[Item]:
    """Decode ``input``: a string (one user message) or an array of items."""
    data = memoryview(raw)  # read in place: a megabyte input is not copied before it is decoded
    if not data or (len(data) == 4 and data.tobytes() == b"null"):
        return []
    if data[:1].tobytes() == b'"':
        return [Message(role="user", content=decode(_str_decoder, data, prefix="input"))]
    try:
        elements = _raw_list_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        raise invalid_request(
            "Invalid type for 'input': expected a string or an array of input items.", "input", "invalid_type"
        ) from None
    return [decode_item(element, i) for i, element in enumerate(elements)]


def decode_item(element: msgspec.Raw | bytes, index: int) -> Item:
    """Decode one input item. A message may omit ``type`` (the "easy" input message form), and so
    may an item reference (``{"id": "msg_…"}``). Hosted-tool items are kept as sent."""
    item: Item
    try:
        item = _item_decoder.decode(element)
    except msgspec.ValidationError as exc:
        head = _probe(element, index)
        kind = head.get("type")
        if kind is None and "role" in head:
            item = decode(_message_decoder, _with_type(element), prefix=f"input[{index}]")
        elif kind is None and "id" in head:
            item = decode(_reference_decoder, _with_type(element, b"item_reference"), prefix=f"input[{index}]")
        elif isinstance(kind, str) and kind in HOSTED_ITEM_TYPES:
            item = _hosted(kind, head, element, index)
        elif isinstance(kind, str) and kind not in ITEM_TYPES:
            raise unsupported_item(kind, index) from None
        else:
            raise from_validation_error(exc, f"input[{index}]") from None
    except msgspec.DecodeError:
        raise not_json(f"input[{index}]") from None
    except RecursionError:
        raise too_deep(f"input[{index}]") from None
    _check_item_depth(item, index)
    return item


def _check_item_depth(item: Item, index: int) -> None:
    """The only free-form values an item can carry: an output text part's annotations/logprobs."""
    content = item.content if isinstance(item, Message) else item.output if isinstance(item, FunctionCallOutput) else None
    if content is None or isinstance(content, str):
        return
    for j, part in enumerate(content):
        if isinstance(part, OutputText) and (part.annotations or part.logprobs):
            check_depth(part.annotations, f"input[{index}].content[{j}].annotations")
            check_depth(part.logprobs, f"input[{index}].content[{j}].logprobs")


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
    except (msgspec.ValidationError, RecursionError):  # ValidationError first: it is a DecodeError
        raise invalid_request(
            f"Invalid type for 'input[{index}]': expected an object.", f"input[{index}]", "invalid_type"
        ) from None
    except msgspec.DecodeError:
        raise not_json(f"input[{index}]") from None
    return head


def _with_type(element: msgspec.Raw | bytes, tag: bytes = b"message") -> bytes:
    data = bytes(element).lstrip()
    head = b'{"type":"' + tag + b'"'
    return head + b"," + data[1:] if data[1:].lstrip()[:1] != b"}" else head + b"}"


#: Fields that are not request options: the input and tools (carried parsed) and WebSocket framing.
_NOT_FORWARDED = frozenset({"input", "tools", "type", "stream_id", "generate", "append"})
_DEFAULTS = CreateResponse()


def client_fields(request: CreateResponse) -> dict[str, Any]:
    """The request's fields as the client set them (values other than the defaults), for backends
    that forward the request (``input``, ``tools`` and WebSocket framing left out)."""
    out: dict[str, Any] = {}
    for name in request.__struct_fields__:
        if name in _NOT_FORWARDED:
            continue
        value = getattr(request, name)
        if value != getattr(_DEFAULTS, name):
            out[name] = value
    return out
