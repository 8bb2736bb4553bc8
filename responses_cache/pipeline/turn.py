"""A turn: one decoded create request on its way through the pipeline."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from ..compaction import Compaction
from ..protocol.items import Item, Reasoning, WireItem
from ..protocol.request import CreateResponse
from ..protocol.response import IncompleteDetails, Response, ResponseErrorInfo, Usage
from ..protocol.tools import ToolSet
from ..quotas import Admission
from ..tracing import NO_TURN, TurnSpan
from .append import AppendChannel
from .interrupt import Interrupt

Transport = Literal["http", "websocket"]


@dataclass(slots=True)
class Turn:
    request: CreateResponse
    #: The new input items of this turn only (decoded once, never re-decoded).
    items: list[Item]
    tools: ToolSet
    tenant: str
    transport: Transport
    lane: str | None = None
    response_id: str = ""
    created_at: float = 0.0
    #: Set when a full-input request was matched against a cached conversation: the number of
    #: leading input items that were already in the cached state.
    reused_items: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    #: Credentials from the client's request, forwarded to backends that need them.
    headers: dict[str, str] = field(default_factory=dict)
    #: The conversation's engine-affinity key (set by the pipeline).
    conversation_key: str = ""
    #: An unknown parent delegated to the backend's own store (see ``GenerationRequest``).
    delegated_parent: str | None = None
    #: Raised by the WebSocket session when steering input waits for this response.
    interrupt: Interrupt | None = None
    #: Set by the WebSocket session for a response that opted in to ``response.append``.
    append: AppendChannel | None = None
    #: Seals each finished reasoning item's text into its ``encrypted_content``
    #: (``include: ["reasoning.encrypted_content"]``; see :mod:`responses_cache.encrypted_reasoning`).
    seal_reasoning: Callable[[Reasoning], Reasoning] | None = None
    #: Seals a summary into a compaction item (``(summary, item id)``; set when the server has a
    #: sealing key; see :mod:`responses_cache.compaction`).
    seal_compaction: Callable[[str, str], Compaction] | None = None
    #: The client's W3C trace-context headers (``traceparent``, ``tracestate``), set by the edge.
    trace: dict[str, str] = field(default_factory=dict)
    #: The turn's span (started when its parent is looked up; ended by the pipeline).
    span: TurnSpan = NO_TURN
    #: Where the parent came from: ``none`` (a first turn), ``connection``, ``full_input``,
    #: ``hot``, ``snapshot``, ``store`` or ``delegated`` (set when the parent is looked up).
    tier: str = "none"
    #: ``time.perf_counter()`` when the turn was made: the start of its timings.
    started: float = field(default_factory=time.perf_counter)
    #: The quota admission the turn runs under (released with :attr:`billed_tokens` when it ends).
    admission: Admission | None = None
    #: Tokens billed for the turn so far (prompt plus output, compaction summaries included).
    billed_tokens: int = 0

    @property
    def model(self) -> str:
        assert self.request.model is not None
        return self.request.model

    def response(
        self,
        status: Any,
        output: list[WireItem],
        *,
        completed_at: int | None = None,
        usage: Usage | None = None,
        error: ResponseErrorInfo | None = None,
        incomplete: IncompleteDetails | None = None,
    ) -> Response:
        """The turn's response object as it stands (``status``, ``output``), echoing the request."""
        r = self.request
        return Response(
            id=self.response_id,
            created_at=int(self.created_at),
            status=status,
            model=self.model,
            output=list(output),
            # The parsed tool set's bytes, shared by every turn that sends the same tools: echoing
            # ``r.tools`` would pin the whole request frame in the cached state.
            tools=msgspec.Raw(self.tools.raw),
            tool_choice=r.tool_choice,
            parallel_tool_calls=r.parallel_tool_calls,
            instructions=r.instructions,
            error=error,
            incomplete_details=incomplete,
            metadata=r.metadata or {},
            temperature=r.temperature,
            top_p=r.top_p,
            previous_response_id=r.previous_response_id,
            store=r.store,
            background=r.background,
            completed_at=completed_at,
            max_output_tokens=r.max_output_tokens,
            max_tool_calls=r.max_tool_calls,
            reasoning=r.reasoning,
            text=r.text or {"format": {"type": "text"}},
            truncation=r.truncation or "disabled",
            service_tier=r.service_tier or "default",
            top_logprobs=r.top_logprobs or 0,
            prompt_cache_key=r.prompt_cache_key,
            safety_identifier=r.safety_identifier,
            user=r.user,
            usage=usage,
        )
