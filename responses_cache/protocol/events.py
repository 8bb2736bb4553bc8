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


class ResponseCreated(Event, tag="response.created"):
    response: Response


class ResponseInProgress(Event, tag="response.in_progress"):
    response: Response


class ResponseCompleted(Event, tag="response.completed"):
    response: Response


class ResponseIncomplete(Event, tag="response.incomplete"):
    response: Response


class ResponseFailed(Event, tag="response.failed"):
    response: Response


class OutputItemAdded(Event, tag="response.output_item.added"):
    output_index: int
    item: Item


class OutputItemDone(Event, tag="response.output_item.done"):
    output_index: int
    item: Item


class ContentPartAdded(Event, tag="response.content_part.added"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class ContentPartDone(Event, tag="response.content_part.done"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class OutputTextDelta(Event, tag="response.output_text.delta"):
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[object]  # required on the wire, so no default (omit_defaults would drop [])


class OutputTextDone(Event, tag="response.output_text.done"):
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[object]  # required on the wire, so no default (omit_defaults would drop [])


class FunctionCallArgumentsDelta(Event, tag="response.function_call_arguments.delta"):
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDone(Event, tag="response.function_call_arguments.done"):
    item_id: str
    output_index: int
    name: str
    arguments: str


class CustomToolCallInputDelta(Event, tag="response.custom_tool_call_input.delta"):
    item_id: str
    output_index: int
    delta: str


class CustomToolCallInputDone(Event, tag="response.custom_tool_call_input.done"):
    item_id: str
    output_index: int
    input: str


class ReasoningSummaryPartAdded(Event, tag="response.reasoning_summary_part.added"):
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryText


class ReasoningSummaryPartDone(Event, tag="response.reasoning_summary_part.done"):
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryText


class ReasoningSummaryTextDelta(Event, tag="response.reasoning_summary_text.delta"):
    item_id: str
    output_index: int
    summary_index: int
    delta: str


class ReasoningSummaryTextDone(Event, tag="response.reasoning_summary_text.done"):
    item_id: str
    output_index: int
    summary_index: int
    text: str


class ErrorEvent(Event, tag="error"):
    """The WebSocket ``error`` event (the nested form plus top-level ``status``)."""

    status: int
    error: ErrorPayload




class ReasoningTextDelta(Event, tag="response.reasoning_text.delta"):
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningTextDone(Event, tag="response.reasoning_text.done"):
    item_id: str
    output_index: int
    content_index: int
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
