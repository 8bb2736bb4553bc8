"""The pipeline: validate → safety → route → render → generate → finalize → billing.

:class:`Pipeline` holds what outlives a turn — the hooks, the validator, the ledger (billing and
its journal), the response store and its item index, metrics, the tracer, the engine gate, the
tokenizer threads and the settings — and starts one :class:`~.run.TurnRun` per turn, which runs
the stages (see :mod:`responses_cache.pipeline.run`). It knows nothing about sockets: events go
out through the ``emit`` callable, and the result is the child
:class:`~responses_cache.storage.state.ResponseState`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ..backends.routing import Route
from ..conversation.compaction import Compaction
from ..limits.fairness import FairGate
from ..observability.metrics import Metrics, NullMetrics
from ..observability.tracing import NO_TRACER, Tracer
from ..protocol.response import CompactedResponse
from ..storage.references import ItemIndex
from ..storage.state import ResponseState
from ..storage.store import ResponseStore
from .compact import DEFAULT_SUMMARY_TOKENS
from .generate import Emit
from .hooks import HookRunner
from .offload import TokenizerPool
from .run import TurnRun
from .turn import Lineage, Turn
from .usage import Ledger, UsageJournalWriter, UsageSubmitter
from .validate import Validator

__all__ = ["Pipeline", "UsageJournalWriter", "UsageSubmitter"]


class Pipeline:
    def __init__(
        self,
        *,
        store: ResponseStore | None = None,
        hooks: HookRunner | None = None,
        validator: Validator | None = None,
        billing: UsageSubmitter | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        max_indexed_items: int = 200_000,
        offload_chars: int = 64 * 1024,
        tokenizer_threads: int | None = None,
        partition_prefix_cache: bool = True,
        truncation_headroom: float = 0.25,
        summary_tokens: int = DEFAULT_SUMMARY_TOKENS,
        tracer: Tracer | None = None,
        engine_gate: FairGate | None = None,
    ) -> None:
        #: Bounds the generations running at once and shares the slots fairly across tenants
        #: (``None``: no bound here; the engine queues).
        self.engine_gate = engine_gate
        #: The most tokens the engine may write for a compaction's summary.
        self.summary_tokens = summary_tokens
        if not 0.0 <= truncation_headroom < 1.0:
            raise ValueError(f"truncation_headroom is a fraction in [0, 1), not {truncation_headroom}")
        #: ``truncation: "auto"`` cuts a prompt that does not fit down to ``1 - this`` of its room.
        self.truncation_headroom = truncation_headroom
        #: Give each tenant its own engine prefix cache (``GenerationRequest.cache_salt``), so time
        #: to first token cannot tell one tenant what another sent. ``False`` shares the cache.
        self.partition_prefix_cache = partition_prefix_cache
        #: Renders that tokenize at least this many characters run on a worker thread.
        self.offload_chars = offload_chars
        #: Worker threads for those renders (more wait their turn, off the event loop). Default: a
        #: quarter of the CPUs, at least one, so floods of huge prompts leave the rest to the loop.
        self.tokenizer_threads = tokenizer_threads or max(1, (os.cpu_count() or 1) // 4)
        self.tokenizers = TokenizerPool(self.tokenizer_threads)
        self.store = store
        #: Stored items by id (tenant-scoped), for ``item_reference`` inputs: each entry names the
        #: stored response that holds the item.
        self.stored_items = ItemIndex(max_indexed_items)
        self.hooks = hooks or HookRunner()
        self.validator = validator or Validator()
        #: Where usage records go (the biller, and its journal when it keeps one).
        self.ledger = Ledger(billing, clock)
        self.metrics = metrics or NullMetrics()
        #: Spans per turn and stage (:mod:`responses_cache.observability.tracing`; nothing by default).
        self.tracer = tracer or NO_TRACER
        self.clock = clock

    @property
    def billing(self) -> UsageSubmitter | None:
        return self.ledger.billing

    @property
    def journal(self) -> UsageJournalWriter | None:
        return self.ledger.journal

    def turn_run(self, turn: Turn, lineage: Lineage, route: Route) -> TurnRun:
        """The run of ``turn`` from ``lineage`` on ``route`` (it holds what the turn bills)."""
        return TurnRun(self, turn, lineage, route)

    async def run(self, turn: Turn, lineage: Lineage, route: Route, emit: Emit) -> ResponseState:
        """Run the turn as a response (see :meth:`TurnRun.respond`)."""
        return await self.turn_run(turn, lineage, route).respond(emit)

    async def compact(
        self, turn: Turn, lineage: Lineage, route: Route, seal: Callable[[str, str], Compaction]
    ) -> CompactedResponse:
        """``POST /v1/responses/compact`` (see :meth:`TurnRun.compact`)."""
        return await self.turn_run(turn, lineage, route).compact(seal)

    async def count_prompt(self, turn: Turn, lineage: Lineage, route: Route) -> int:
        """``POST /v1/responses/input_tokens`` (see :meth:`TurnRun.count_prompt`)."""
        return await self.turn_run(turn, lineage, route).count_prompt()

    def close(self) -> None:
        """Stop the tokenizer threads (idle ones exit at once; running renders finish)."""
        self.tokenizers.close()

    async def aclose(self) -> None:
        """:meth:`close`, as the owning service's lifecycle calls it."""
        self.close()
