"""Usage and billing: a turn's token figures, its usage records, and the journal's open entry.

:class:`Ledger` is the pipeline's side of billing (it outlives turns): it hands a response's
record to the biller (the write-ahead journal's close entry when it has one), a compaction's
record apart, and the open entry that precedes ``response.created``. Billing never breaks a turn.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from ..backends.routing import Route
from ..billing.journal import OpenEntry
from ..billing.record import UsageRecord
from ..protocol.response import Usage
from .progress import Progress
from .render import RenderedPrompt
from .turn import Turn

logger = logging.getLogger("responses_cache.pipeline")

#: A progress mark is journaled at each output item's end and after this many output tokens.
MARK_EVERY_TOKENS = 64


class UsageSubmitter(Protocol):
    def submit(self, record: UsageRecord) -> None: ...


@runtime_checkable
class UsageJournalWriter(Protocol):
    """A biller with a write-ahead journal (:class:`~responses_cache.billing.Biller`).

    ``begin`` runs before ``response.created`` goes out and ``end`` before the terminal event;
    an awaitable result (durability ``machine``) is awaited before that event is sent."""

    def begin(self, entry: OpenEntry) -> Awaitable[None] | None: ...

    def progress(
        self,
        response_id: str,
        output_tokens: int,
        reasoning_tokens: int = 0,
        *,
        input_tokens: int | None = None,
        cached_tokens: int | None = None,
    ) -> None: ...

    def end(self, record: UsageRecord) -> Awaitable[None] | None: ...


def prompt_tokens(turn: Turn, route: Route, rendered: RenderedPrompt | None) -> tuple[int, int]:
    """``(input_tokens, cached_tokens)`` as known before generation (0 without a renderer)."""
    if not turn.request.generate or rendered is None or route.renderer is None:
        return 0, 0
    return rendered.log.num_tokens + len(route.renderer.generation_prompt), rendered.cached_tokens


def usage_of(turn: Turn, route: Route, progress: Progress) -> Usage:
    """``input_tokens`` is the prompt the engine saw (log + generation prompt); ``cached_tokens``
    the prefix reused from the cached log. A warm-up runs no model and uses nothing. A response
    kept open by ``response.append`` adds its earlier engine calls (``progress.spent``: prompt,
    cached and output tokens) to the current one's, whose output starts at ``output_start``."""
    if not turn.request.generate:
        return Usage.of(0, 0, 0)
    engine, spent = progress.engine_usage, progress.spent
    if progress.rendered is not None and route.renderer is not None:
        prompt, cached = prompt_tokens(turn, route, progress.rendered)
    else:
        prompt = (engine.prompt_tokens or 0) if engine else 0
        cached = min((engine.cached_tokens or 0) if engine else 0, prompt)
    output = progress.out.output_tokens - progress.output_start
    if engine is not None and engine.output_tokens is not None:
        output = engine.output_tokens
    return Usage.of(prompt + spent[0], cached + spent[1], output + spent[2], progress.out.reasoning_tokens)


class Ledger:
    """Where usage goes: the biller (``None``: nowhere) and its journal, when it keeps one."""

    def __init__(self, billing: UsageSubmitter | None, clock: Callable[[], float]) -> None:
        self.billing = billing
        self.journal = billing if isinstance(billing, UsageJournalWriter) else None
        self.clock = clock

    def open_entry(self, turn: Turn, route: Route, rendered: RenderedPrompt | None) -> OpenEntry:
        prompt, cached = prompt_tokens(turn, route, rendered)
        return OpenEntry(
            id=turn.response_id,
            tenant=turn.tenant,
            model=turn.model,
            route=route.name,
            created_at=turn.created_at,
            input_tokens=prompt,
            cached_tokens=min(cached, prompt),
            transport=turn.transport,
            previous_response_id=turn.request.previous_response_id,
            background=turn.request.background,
        )

    def bill(self, turn: Turn, route: Route, usage: Usage, status: str) -> Awaitable[None] | None:
        """Hand the response's usage record to billing; an awaitable result is awaited before
        the terminal event goes out (journal durability ``machine``)."""
        if self.billing is None:
            return None
        try:
            record = self.record(turn, route, turn.response_id, status, usage)
            if self.journal is not None:
                return self.journal.end(record)
            self.billing.submit(record)
        except Exception:  # billing must never break a turn; the biller keeps what it can
            logger.exception("could not submit the usage record of %s", turn.response_id)
        return None

    def bill_summary(self, turn: Turn, route: Route, summary_id: str, usage: Usage) -> None:
        """A compaction's usage: a record of its own (its id), apart from any response's."""
        if self.billing is None:
            return
        try:
            self.billing.submit(self.record(turn, route, summary_id, "completed", usage))
        except Exception:  # billing must never break a turn; the biller keeps what it can
            logger.exception("could not submit the usage record of compaction %s", summary_id)

    def record(self, turn: Turn, route: Route, response_id: str, status: str, usage: Usage) -> UsageRecord:
        """The usage record billed under ``response_id`` (the response's, or a compaction's)."""
        return UsageRecord(
            response_id=response_id,
            tenant=turn.tenant,
            model=turn.model,
            route=route.name,
            status=status,  # type: ignore[arg-type]
            input_tokens=usage.input_tokens,
            cached_tokens=usage.input_tokens_details.cached_tokens,
            output_tokens=usage.output_tokens,
            reasoning_tokens=usage.output_tokens_details.reasoning_tokens,
            created_at=turn.created_at,
            finished_at=self.clock(),
            transport=turn.transport,
            previous_response_id=turn.request.previous_response_id,
        )
