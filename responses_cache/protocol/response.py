"""The Response object and its usage block, as carried by ``response.*`` events and ``GET``."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .items import WireItem

Status = Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]


class InputTokensDetails(msgspec.Struct, frozen=True):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct, frozen=True):
    reasoning_tokens: int = 0


class Usage(msgspec.Struct, frozen=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int

    @classmethod
    def of(cls, input_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int = 0) -> Usage:
        return cls(
            input_tokens=input_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=cached_tokens, cache_write_tokens=0),
            output_tokens=output_tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
            total_tokens=input_tokens + output_tokens,
        )


class ResponseErrorInfo(msgspec.Struct, frozen=True):
    code: str
    message: str


class IncompleteDetails(msgspec.Struct, frozen=True):
    reason: str


class TruncationDetails(msgspec.Struct, frozen=True):
    """What ``truncation: "auto"`` dropped to fit the context window (an extension field of the
    Response object, present only on a response whose prompt was truncated)."""

    #: Items dropped from the start of the conversation.
    dropped_items: int
    #: Prompt tokens those items took (the untruncated prompt minus the one the engine got).
    dropped_tokens: int


class Response(msgspec.Struct, kw_only=True):
    """A Response object. Required fields are always encoded; ``None`` encodes as ``null``."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    model: str
    output: list[WireItem]
    tools: msgspec.Raw | list[Any]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    instructions: str | None = None
    error: ResponseErrorInfo | None = None
    incomplete_details: IncompleteDetails | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    temperature: float | None = None
    top_p: float | None = None
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    completed_at: int | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] = msgspec.field(default_factory=lambda: {"format": {"type": "text"}})
    truncation: str = "disabled"
    service_tier: str = "default"
    top_logprobs: int = 0
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    user: str | None = None
    usage: Usage | None = None
    #: Set only when ``truncation: "auto"`` dropped items (left out of the JSON otherwise).
    truncation_details: TruncationDetails | msgspec.UnsetType = msgspec.UNSET


class CompactedResponse(msgspec.Struct, kw_only=True):
    """``POST /v1/responses/compact``'s answer (the SDK's ``CompactedResponse``): every user
    message of the conversation, then one ``compaction`` item."""

    id: str
    object: Literal["response.compaction"] = "response.compaction"
    created_at: int
    #: Messages and a compaction item (a server-made item, encoded by the codec's hook).
    output: list[Any]
    usage: Usage
