"""A turn: one decoded create request on its way through the pipeline."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ..conversation.compaction import Compaction
from ..limits.quotas import Admission
from ..observability.tracing import NO_TURN, TurnSpan
from ..protocol.items import Item, Reasoning, WireItem
from ..protocol.request import CreateResponse
from ..protocol.response import IncompleteDetails, Response, ResponseErrorInfo, Usage
from ..protocol.tools import ToolSet
from .append import AppendChannel
from .interrupt import Interrupt

if TYPE_CHECKING:
    from ..storage.state import ResponseState

Transport = Literal["http", "websocket"]


@dataclass(frozen=True, slots=True)
class Turn:
    """The request part of a turn: built once at the edge (:meth:`Responder.prepare
    <responses_cache.core.responder.Responder.prepare>`, then the transport's own channels) and
    never changed after. Where it continues from is a :class:`Lineage`; what changes while it runs
    lives on its :class:`~responses_cache.pipeline.run.TurnRun`."""

    request: CreateResponse
    #: The new input items of this turn, as the client sent them (decoded once, never re-decoded;
    #: the items that run are :attr:`Lineage.items`).
    items: list[Item]
    tools: ToolSet
    tenant: str
    transport: Transport
    lane: str | None = None
    response_id: str = ""
    created_at: float = 0.0
    #: Credentials from the client's request, forwarded to backends that need them.
    headers: dict[str, str] = field(default_factory=dict)
    #: Raised by the WebSocket session when steering input waits for this response.
    interrupt: Interrupt | None = None
    #: Set by the WebSocket session for a response that opted in to ``response.append``.
    append: AppendChannel | None = None
    #: Seals each finished reasoning item's text into its ``encrypted_content``
    #: (``include: ["reasoning.encrypted_content"]``; see :mod:`responses_cache.conversation.encrypted_reasoning`).
    seal_reasoning: Callable[[Reasoning], Reasoning] | None = None
    #: Seals a summary into a compaction item (``(summary, item id)``; set when the server has a
    #: sealing key; see :mod:`responses_cache.conversation.compaction`).
    seal_compaction: Callable[[str, str], Compaction] | None = None
    #: The client's W3C trace-context headers (``traceparent``, ``tracestate``), from the edge.
    trace: dict[str, str] = field(default_factory=dict)
    #: ``time.perf_counter()`` when the turn was made: the start of its timings.
    started: float = field(default_factory=time.perf_counter)
    #: The quota admission the turn runs under (released, with the tokens its run billed, when it
    #: ends; see :meth:`Responder.run <responses_cache.core.responder.Responder.run>`).
    admission: Admission | None = None

    def on_connection(self, interrupt: Interrupt | None, append: AppendChannel | None) -> Turn:
        """The turn with the WebSocket session's channels into it (steering, ``response.append``),
        which the session opens once the turn has its id."""
        return dataclasses.replace(self, interrupt=interrupt, append=append)

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


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a turn continues from, as :meth:`Responder.parent_of
    <responses_cache.core.responder.Responder.parent_of>` found it (built once, never changed)."""

    #: The state the turn continues (``None``: a first turn, or one delegated to the backend).
    parent: ResponseState | None
    #: The items that run: item references resolved, and a full-input resend cut to the ones
    #: :attr:`parent` does not hold.
    items: list[Item]
    #: A full-input request matched against a cached conversation: the number of leading input
    #: items that were already in the cached state.
    reused_items: int = 0
    #: Where the parent came from: ``none`` (a first turn), ``connection``, ``full_input``,
    #: ``hot``, ``snapshot``, ``store`` or ``delegated``.
    tier: str = "none"
    #: An unknown parent delegated to the backend's own store (see ``GenerationRequest``).
    delegated_parent: str | None = None
    #: The turn's span (started when its parent was looked up; ended by its run).
    span: TurnSpan = NO_TURN

    @classmethod
    def first(cls, turn: Turn, parent: ResponseState | None = None) -> Lineage:
        """A turn run as it came, on ``parent`` (no lookup: a bare pipeline's)."""
        return cls(parent, turn.items)
