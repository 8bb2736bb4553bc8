"""The ``Backend`` protocol: the one boundary between the pipeline and an inference engine.

A backend receives a :class:`GenerationRequest` and yields :data:`BackendEvent` values. The request
carries **both** forms of the context, so each backend takes what its engine accepts:

* ``prompt`` — the rendered prompt as token ids (an incremental token log plus the generation
  prompt) when the route has a renderer: for engines that accept token ids (vLLM and SGLang
  ``/v1/completions``, Cerebras raw completions).
* ``conversation`` — the structured items (with ``instructions`` and ``tools``): for engines that
  take messages (chat-completions APIs). ``conversation.items()`` walks the whole history, so only
  call it when the engine needs it.

The pipeline turns the events into output items and server events; a backend never builds
Response objects or wire events itself.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..conversation import Conversation
from ..engine_events import (
    BackendEvent,
    EngineUsage,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from ..protocol.tools import ToolSet
from ..tokens.base import Renderer
from ..tokens.log import TokenLog

__all__ = [
    "Backend",
    "BackendError",
    "BackendEvent",
    "EngineUsage",
    "Finish",
    "GenerationRequest",
    "PreflightBackend",
    "Prompt",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallStart",
]


@dataclass(frozen=True, slots=True)
class Prompt:
    """The rendered prompt of one generation."""

    log: TokenLog
    renderer: Renderer

    def tokens(self) -> Sequence[int]:
        """All prompt token ids, generation prompt included (O(prompt))."""
        return self.renderer.prompt(self.log)

    @property
    def num_tokens(self) -> int:
        """Prompt length without the generation prompt (O(1))."""
        return self.log.num_tokens


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    response_id: str
    model: str
    instructions: str | None
    tools: ToolSet
    conversation: Conversation
    prompt: Prompt | None
    affinity_key: str
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    #: Credentials of the client's request (``authorization``), for backends that forward them.
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The client's request fields as sent (those that differ from their defaults), ``input`` and
    #: ``tools`` aside (see ``conversation`` and ``tools``): ``text``, ``top_logprobs``,
    #: ``truncation``, ``user``, ``include``… for backends that forward requests or map them onto
    #: engine options.
    client_fields: Mapping[str, Any] = field(default_factory=dict)
    #: Set only when the server delegates an unknown ``previous_response_id`` to a backend that
    #: keeps its own response store (the bridge to a wrapped app); ``conversation`` is then just
    #: the new input.
    previous_response_id: str | None = None
    #: The tenant the request belongs to ("" when the server has no authentication).
    tenant: str = ""
    #: Partitions the engine's prefix cache (vLLM/SGLang ``cache_salt``); set per tenant by default.
    cache_salt: str | None = None
    #: W3C trace-context headers (``traceparent``, ``tracestate``) for the engine request: an
    #: adapter copies them onto its HTTP request, so the engine's own spans join the turn's trace
    #: (under its ``engine`` stage; the client's own trace context when nothing traces here).
    trace_context: Mapping[str, str] = field(default_factory=dict)
    #: The request's scheduling priority (lower runs earlier, as vLLM orders it), for engines that
    #: take one (vLLM and SGLang ``priority``); ``None``: the engine's default.
    priority: int | None = None




class BackendError(Exception):
    """A generation failure; reported to the client as ``response.failed`` with this code."""

    def __init__(self, message: str, code: str = "server_error", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        #: Seconds the engine asked the client to wait before retrying (a 429's hint), if any.
        self.retry_after = retry_after


@runtime_checkable
class Backend(Protocol):
    """An inference engine.

    ``generate`` is an async generator (``async def`` with ``yield``): the pipeline iterates it and
    closes it (``aclose()``) when the client goes away or a safety hook stops the response, so its
    ``finally`` must stop the engine's work (close the HTTP stream, abort the request).

    Lifecycle: a backend that holds connections or tasks also defines ``async def start()`` (called
    once before the first request) and/or ``async def aclose()`` (called once at shutdown), like an
    httpx client. The :class:`~responses_cache.Service` that owns the backend calls them inside the
    host app's lifespan; a backend without them needs nothing.

    A backend that knows its engine's context window exposes it as ``context_window: int | None``
    (the adapters read it from the engine at start): a prompt above the smaller of the route's and
    the engine's window is refused with ``context_length_exceeded`` before the response exists.
    """

    def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]: ...

    def models(self) -> Sequence[str]:
        """Model names this backend serves (for ``GET /v1/models``)."""
        ...

    @property
    def accepts_media(self) -> bool:
        """Whether ``input_image``/``input_file`` parts can be handed to this engine."""
        ...


@runtime_checkable
class PreflightBackend(Protocol):
    """A backend that can refuse a request before the response exists.

    The pipeline awaits ``open_stream`` before it sends ``response.created``; a
    :class:`~responses_cache.protocol.errors.ResponsesError` raised there reaches the client as a
    plain error (an HTTP 4xx, a WebSocket ``error`` event) with its status and message, as if the
    server had refused the request itself. The returned iterator is then consumed like
    ``generate``'s."""

    async def open_stream(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]: ...
