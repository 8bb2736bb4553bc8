"""The engine's side of compaction: one ordinary generation that writes the summary.

:func:`summarize` appends :data:`~responses_cache.conversation.compaction.SUMMARY_PROMPT` to the conversation
(to its token log when it has one: the summary request costs one item's render and reuses the
engine's prefix cache) and streams the route's backend like any response; the text it writes is
the summary. It works on every backend: prompt-based engines get the token log, message-based
ones the conversation. Its usage is its own (billed as a separate record by the caller).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..backends.base import (
    EngineUsage,
    Finish,
    GenerationRequest,
    Prompt,
    ReasoningDelta,
    TextDelta,
)
from ..backends.routing import Route
from ..conversation import Conversation
from ..conversation.compaction import SUMMARY_PROMPT, expand_conversation, expanded
from ..protocol.errors import invalid_request
from ..protocol.items import Message
from ..protocol.response import Usage
from ..protocol.tools import ToolSet
from ..tokens.log import TokenLog
from .closing import close_stream

#: The most tokens a summary may take (``ServerConfig.compaction_max_output_tokens``).
DEFAULT_SUMMARY_TOKENS = 4096

PROMPT_ITEM = Message(role="user", content=SUMMARY_PROMPT)


@dataclass(frozen=True, slots=True)
class Summary:
    text: str
    usage: Usage


def compact_threshold(context_management: list[dict[str, Any]] | None) -> int | None:
    """The ``compact_threshold`` of a request's ``context_management`` (``None``: no compaction).

    Only the ``compaction`` entry type exists; a threshold must be a positive integer. Errors
    are 400s naming the entry (``context_management[i].…``)."""
    if not context_management:
        return None
    threshold: int | None = None
    for index, entry in enumerate(context_management):
        kind = entry.get("type")
        if kind != "compaction":
            raise invalid_request(
                f"Invalid value: {kind!r}. Supported values are: 'compaction'.",
                f"context_management[{index}].type",
                "invalid_value",
            )
        value = entry.get("compact_threshold")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise invalid_request(
                f"Invalid 'context_management[{index}].compact_threshold': expected a positive integer.",
                f"context_management[{index}].compact_threshold",
                "invalid_value",
            )
        threshold = value
    return threshold


@dataclass(frozen=True, slots=True)
class SummaryJob:
    """What a summary is written for: the conversation (``context``, rendered as ``log`` when the
    route has a renderer), whose it is, and how far the engine may write."""

    response_id: str
    model: str
    instructions: str | None
    tools: ToolSet
    context: Conversation
    log: TokenLog | None
    affinity_key: str
    tenant: str
    cache_salt: str | None
    headers: Mapping[str, str]
    max_output_tokens: int


async def summarize(route: Route, job: SummaryJob, on_sample: Callable[[], Awaitable[None]] | None = None) -> Summary:
    """The engine's summary of ``job.context``.

    ``on_sample`` is awaited after each piece of summary text (the caller streams progress).
    A backend failure raises :class:`~responses_cache.backends.base.BackendError`; an engine
    that stops the summary at ``max_output_tokens`` leaves it cut there; one that writes no
    text gives an empty summary (the caller bills it, then refuses it)."""
    request, prompt, cached = _summary_request(route, job)
    sampled = await _sample(route, request, on_sample)
    renderer = route.renderer
    engine = sampled.engine
    if prompt is not None and renderer is not None:
        input_tokens = prompt.num_tokens + len(renderer.generation_prompt)
    else:
        input_tokens = (engine.prompt_tokens or 0) if engine else 0
        cached = min((engine.cached_tokens or 0) if engine else 0, input_tokens)
    output = engine.output_tokens if engine is not None and engine.output_tokens is not None else sampled.tokens
    return Summary(sampled.text, Usage.of(input_tokens, cached, output, min(sampled.reasoning, output)))


def _summary_request(route: Route, job: SummaryJob) -> tuple[GenerationRequest, Prompt | None, int]:
    """The summary's generation request, its prompt (``None`` without a renderer) and the
    tokens of it the conversation's log already holds."""
    renderer, log = route.renderer, job.log
    prompt = None
    cached = 0
    if renderer is not None:
        if log is None:
            log = renderer.render_full(job.instructions, job.tools, expand_conversation(job.context).items())
        prompt_log = renderer.extend(log, [expanded(PROMPT_ITEM)])
        prompt, cached = Prompt(prompt_log, renderer), log.num_tokens
    conversation = job.context.extend([PROMPT_ITEM])
    request = GenerationRequest(
        response_id=job.response_id,
        model=job.model,
        instructions=job.instructions,
        tools=job.tools,
        conversation=conversation if renderer is not None else expand_conversation(conversation),
        prompt=prompt,
        affinity_key=job.affinity_key,
        max_output_tokens=job.max_output_tokens,
        tool_choice="none",
        headers=job.headers,
        tenant=job.tenant,
        cache_salt=job.cache_salt,
    )
    return request, prompt, cached


@dataclass(frozen=True, slots=True)
class _Sampled:
    text: str
    #: Tokens sampled (a delta without ids counts as one), and of them reasoning.
    tokens: int
    reasoning: int
    engine: EngineUsage | None


async def _sample(
    route: Route, request: GenerationRequest, on_sample: Callable[[], Awaitable[None]] | None
) -> _Sampled:
    pieces: list[str] = []
    sampled = reasoning = 0
    engine: EngineUsage | None = None
    stream = route.backend.generate(request)
    try:
        async for event in stream:
            if isinstance(event, Finish):
                engine = event.usage
                break
            sampled += len(getattr(event, "token_ids", ())) or 1
            if isinstance(event, ReasoningDelta):
                reasoning += len(event.token_ids) or 1
            elif isinstance(event, TextDelta):
                pieces.append(event.text)
                if on_sample is not None:
                    await on_sample()
            # A tool call is not a summary: its tokens are counted, its text is not kept.
    finally:
        with contextlib.suppress(Exception):
            await close_stream(stream)
    return _Sampled("".join(pieces).strip(), sampled, reasoning, engine)
