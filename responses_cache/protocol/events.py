"""Server events: the SSE ``data:`` payloads, also sent one per WebSocket text frame.

Each event carries ``sequence_number`` (per response stream, from 0). Events of a named
WebSocket lane also carry ``stream_id``; it is omitted otherwise (``omit_defaults``).
"""

from __future__ import annotations

import msgspec

from .errors import ErrorPayload
from .items import Item, OutputText, SummaryText
from .response import Response


class Event(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    #: -1 (omitted on the wire) for events outside a response stream, e.g. request errors.
    sequence_number: int = -1
    stream_id: str | None = None


class ResponseEvent(Event):
    """An event that carries the whole Response object (its lifecycle)."""

    response: Response


class ItemEvent(Event):
    """An event about one output item, by id and position."""

    item_id: str
    output_index: int


class ContentEvent(ItemEvent):
    """An event about one content part of an output item."""

    content_index: int


class SummaryEvent(ItemEvent):
    """An event about one summary part of a reasoning item."""

    summary_index: int


class ResponseCreated(ResponseEvent, tag="response.created"):
    pass


class ResponseInProgress(ResponseEvent, tag="response.in_progress"):
    pass


class ResponseCompleted(ResponseEvent, tag="response.completed"):
    pass


class ResponseIncomplete(ResponseEvent, tag="response.incomplete"):
    pass


class ResponseFailed(ResponseEvent, tag="response.failed"):
    pass


class OutputItemAdded(Event, tag="response.output_item.added"):
    output_index: int
    item: Item


class OutputItemDone(Event, tag="response.output_item.done"):
    output_index: int
    item: Item


class CompactionCompacting(Event, tag="response.compaction.compacting"):
    """Summary text was sampled for a compaction (``context_management``); carries none of it."""

    item_id: str
    output_index: int


class ContentPartAdded(ContentEvent, tag="response.content_part.added"):
    part: OutputText


class ContentPartDone(ContentEvent, tag="response.content_part.done"):
    part: OutputText


class OutputTextDelta(ContentEvent, tag="response.output_text.delta"):
    delta: str
    logprobs: list[object]  # required on the wire, so no default (omit_defaults would drop [])


class OutputTextDone(ContentEvent, tag="response.output_text.done"):
    text: str
    logprobs: list[object]  # required on the wire, so no default (omit_defaults would drop [])


class FunctionCallArgumentsDelta(ItemEvent, tag="response.function_call_arguments.delta"):
    delta: str


class FunctionCallArgumentsDone(ItemEvent, tag="response.function_call_arguments.done"):
    name: str
    arguments: str


class CustomToolCallInputDelta(ItemEvent, tag="response.custom_tool_call_input.delta"):
    delta: str


class CustomToolCallInputDone(ItemEvent, tag="response.custom_tool_call_input.done"):
    input: str


class ReasoningSummaryPartAdded(SummaryEvent, tag="response.reasoning_summary_part.added"):
    part: SummaryText


class ReasoningSummaryPartDone(SummaryEvent, tag="response.reasoning_summary_part.done"):
    part: SummaryText


class ReasoningSummaryTextDelta(SummaryEvent, tag="response.reasoning_summary_text.delta"):
    delta: str


class ReasoningSummaryTextDone(SummaryEvent, tag="response.reasoning_summary_text.done"):
    text: str


class ErrorEvent(Event, tag="error"):
    """The WebSocket ``error`` event (the nested form plus top-level ``status``)."""

    status: int
    error: ErrorPayload
    #: The headers the same failure would have had over HTTP (a quota refusal's ``retry-after``
    #: and ``x-ratelimit-*``); omitted when there are none.
    headers: dict[str, str] | None = None


class ReasoningTextDelta(ContentEvent, tag="response.reasoning_text.delta"):
    delta: str


class ReasoningTextDone(ContentEvent, tag="response.reasoning_text.done"):
    text: str


ServerEvent = (
    ResponseCreated
    | ResponseInProgress
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | CustomToolCallInputDelta
    | CustomToolCallInputDone
    | ReasoningSummaryPartAdded
    | ReasoningSummaryPartDone
    | ReasoningSummaryTextDelta
    | ReasoningSummaryTextDone
    | ReasoningTextDelta
    | ReasoningTextDone
    | ErrorEvent
)
TERMINAL = (ResponseCompleted, ResponseIncomplete, ResponseFailed)
