"""Conversation items: what a request's ``input`` carries and what a response's ``output`` holds.

Input and output share one set of item types because a response's output items become part of the
next turn's context. Each item is a ``msgspec.Struct`` tagged on ``type``; message content parts
are a tagged union of their own. Items are immutable once built (``frozen=True``), so a cached
conversation can be shared between a parent response and all of its children without copying.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

Role = Literal["user", "system", "developer", "assistant"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class InputText(msgspec.Struct, tag="input_text", frozen=True):
    text: str


class OutputText(msgspec.Struct, tag="output_text", frozen=True):
    # No omit_defaults: ``annotations`` and ``logprobs`` must appear on the wire.
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


class Refusal(msgspec.Struct, tag="refusal", frozen=True):
    refusal: str


class InputImage(msgspec.Struct, tag="input_image", frozen=True, omit_defaults=True):
    image_url: str | None = None
    file_id: str | None = None
    detail: str = "auto"


class InputFile(msgspec.Struct, tag="input_file", frozen=True, omit_defaults=True):
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


ContentPart = InputText | OutputText | Refusal | InputImage | InputFile
MEDIA_PARTS = (InputImage, InputFile)


class Message(msgspec.Struct, tag="message", frozen=True, omit_defaults=True):
    role: Role
    content: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCall(msgspec.Struct, tag="function_call", frozen=True, omit_defaults=True):
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = None


class FunctionCallOutput(msgspec.Struct, tag="function_call_output", frozen=True, omit_defaults=True):
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None


class SummaryText(msgspec.Struct, tag="summary_text", frozen=True):
    text: str


class ReasoningText(msgspec.Struct, tag="reasoning_text", frozen=True):
    text: str


class Reasoning(msgspec.Struct, tag="reasoning", frozen=True, omit_defaults=True):
    # ``summary`` is required by the schema, so it has no default and is always encoded.
    summary: list[SummaryText]
    id: str | None = None
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


class CustomToolCall(msgspec.Struct, tag="custom_tool_call", frozen=True, omit_defaults=True):
    """A call of a custom (freeform) tool: ``input`` is plain text, not JSON arguments."""

    call_id: str
    name: str
    input: str
    id: str | None = None
    namespace: str | None = None


class CustomToolCallOutput(msgspec.Struct, tag="custom_tool_call_output", frozen=True, omit_defaults=True):
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None


class CompactionItem(msgspec.Struct, tag="compaction", frozen=True, omit_defaults=True):
    """A compaction item as the wire carries it: a summary sealed by the server. The server opens
    it into :class:`responses_cache.conversation.compaction.Compaction` before anything reads it."""

    encrypted_content: str
    id: str | None = None
    created_by: str | None = None


class CompactionTrigger(msgspec.Struct, tag="compaction_trigger", frozen=True, omit_defaults=True):
    """As the final input item: compact the conversation now, before answering."""

    id: str | None = None


class ItemReference(msgspec.Struct, tag="item_reference", frozen=True):
    """A reference to an earlier item by id; replaced by that item before the turn runs."""

    id: str


class HostedItem:
    """An item of a hosted tool this server does not run (``web_search_call``, ``mcp_call``,
    ``mcp_call``…), kept exactly as the client sent it: ``raw`` is its JSON, re-encoded
    byte for byte (see :func:`enc_hook`)."""

    __slots__ = ("call_id", "id", "raw", "type")

    def __init__(self, type: str, raw: bytes, id: str | None = None, call_id: str | None = None) -> None:
        self.type = type
        self.raw = raw
        self.id = id
        self.call_id = call_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostedItem) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return f"HostedItem({self.type!r}, {self.raw!r})"


def enc_hook(obj: Any) -> Any:
    """msgspec encoder hook: a :class:`HostedItem` encodes as the JSON it came with."""
    if isinstance(obj, HostedItem):
        return msgspec.Raw(obj.raw)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


#: Items decoded by msgspec (tagged on ``type``).
WireItem = (
    Message | FunctionCall | FunctionCallOutput | Reasoning | CustomToolCall | CustomToolCallOutput | ItemReference
    | CompactionItem | CompactionTrigger
)
Item = WireItem | HostedItem
ITEM_TYPES: frozenset[str] = frozenset(
    {
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        "custom_tool_call",
        "custom_tool_call_output",
        "item_reference",
        "compaction",
        "compaction_trigger",
    }
)
#: Items of hosted tools (and other server-side features) accepted in input and carried as sent,
#: with the fields each must have (besides ``type``), as the Responses API defines them.
HOSTED_ITEMS: dict[str, tuple[str, ...]] = {
    "web_search_call": ("id", "action", "status"),
    "file_search_call": ("id", "queries", "status"),
    "computer_call": ("id", "call_id", "pending_safety_checks", "status"),
    "computer_call_output": ("call_id", "output"),
    "code_interpreter_call": ("id", "code", "container_id", "outputs", "status"),
    "image_generation_call": ("id", "result", "status"),
    "local_shell_call": ("id", "action", "call_id", "status"),
    "local_shell_call_output": ("id", "output"),
    "shell_call": ("action", "call_id"),
    "shell_call_output": ("call_id", "output"),
    "apply_patch_call": ("call_id", "operation", "status"),
    "apply_patch_call_output": ("call_id", "status"),
    "mcp_list_tools": ("id", "server_label", "tools"),
    "mcp_approval_request": ("id", "arguments", "name", "server_label"),
    "mcp_approval_response": ("approval_request_id", "approve"),
    "mcp_call": ("id", "arguments", "name", "server_label"),
    "tool_search_call": ("arguments",),
    "tool_search_output": ("tools",),
}
HOSTED_ITEM_TYPES: frozenset[str] = frozenset(HOSTED_ITEMS)


def content_texts(content: str | Sequence[ContentPart]) -> list[str]:
    """The text of each text or refusal part (media parts carry none)."""
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    for part in content:
        if isinstance(part, (InputText, OutputText)):
            out.append(part.text)
        elif isinstance(part, Refusal):
            out.append(part.refusal)
    return out


def text_of(content: str | Sequence[ContentPart]) -> str:
    """The plain text of a message's content (text and refusal parts, concatenated)."""
    return content if isinstance(content, str) else "".join(content_texts(content))


def has_media(item: Item) -> bool:
    """True when the item carries an image or file part."""
    content: Any
    if isinstance(item, Message):
        content = item.content
    elif isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
        content = item.output
    else:
        return False
    return not isinstance(content, str) and any(isinstance(p, MEDIA_PARTS) for p in content)
