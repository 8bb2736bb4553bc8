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


Item = Message | FunctionCall | FunctionCallOutput | Reasoning
ITEM_TYPES: frozenset[str] = frozenset({"message", "function_call", "function_call_output", "reasoning"})


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
    elif isinstance(item, FunctionCallOutput):
        content = item.output
    else:
        return False
    return not isinstance(content, str) and any(isinstance(p, MEDIA_PARTS) for p in content)
