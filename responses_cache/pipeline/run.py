"""One turn running through the pipeline: :class:`TurnRun`.

A run holds what one turn carries — the request (:class:`~.turn.Turn`), where it continues from
(:class:`~.turn.Lineage`: its parent, the items that run, its span), its route, its hook context,
its engine slot — and what changes while it runs: its conversation key, its timings, the tokens
billed for it, and the response's :class:`~.progress.Progress`. It owns the stages, in order:

``prologue`` (validate → continuation → render, the one way a response, a compaction and a count
start), ``_open_engine`` (an engine slot, the generation request), ``_respond`` (from
``response.created`` through the engine's stream and any ``response.append`` rounds) and
``_finish`` (bill, make the child state, store, send the terminal event). A failure before
``response.created`` raises :class:`~responses_cache.protocol.errors.ResponsesError`; a failure
after it ends the response with ``response.failed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import logging
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..backends.base import (
    BackendError,
    BackendEvent,
    Finish,
    GenerationRequest,
    PreflightBackend,
    Prompt,
)
from ..backends.routing import Route
from ..conversation import EMPTY, Conversation
from ..conversation.compaction import Compaction, expand_conversation, expanded, user_messages
from ..observability.tracing import NO_STAGE
from ..protocol import events as ev
from ..protocol.errors import ResponsesError, invalid_request
from ..protocol.ids import new_id
from ..protocol.items import Item
from ..protocol.request import client_fields
from ..protocol.response import (
    CompactedResponse,
    IncompleteDetails,
    Response,
    ResponseErrorInfo,
    TruncationDetails,
    Usage,
)
from ..protocol.tools import tool_cache
from ..storage.listing import wire_item
from ..storage.state import ResponseState
from ..tokens.log import TokenLog
from .admit import (
    Admitted,
    Continuation,
    compaction_trigger,
    continuation,
    renumbered,
    truncation_budget,
)
from .append import AwaitingInput, append_tokens, calls_since, may_append
from .closing import close_stream
from .compact import Summary, SummaryJob, compact_threshold, summarize
from .generate import Emit, EngineRound, OutputBuilder, Watcher
from .hooks import Flag, HookContext, Verdict
from .observe import EngineClock, TurnLog, describe, observe
from .offload import render_size
from .persist import Outcome, child_state, stored_response
from .progress import Progress
from .render import PromptSource, RenderedPrompt, render
from .slot import SlotLease, engine_slot
from .turn import Lineage, Turn
from .usage import MARK_EVERY_TOKENS, usage_of

if TYPE_CHECKING:
    from .pipeline import Pipeline

logger = logging.getLogger("responses_cache.pipeline")


def tenant_salt(tenant: str) -> str:
    """The engine prefix-cache salt of a tenant: stable, and not the tenant's name."""
    return hashlib.sha256(b"responses-cache/prefix-cache/" + tenant.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class TurnRun:
    def __init__(self, pipeline: Pipeline, turn: Turn, lineage: Lineage, route: Route) -> None:
        self.pipeline = pipeline
        self.turn = turn
        self.lineage = lineage
        self.route = route
        self.parent = lineage.parent
        self.span = lineage.span
        self.ctx = HookContext(turn.tenant, turn.model, turn.response_id, turn.lane, turn.transport)
        self.log = TurnLog(turn, lineage)
        #: The engine slot the turn's engine calls hold (scoped by ``async with``).
        self.lease = SlotLease(pipeline.engine_gate, turn.tenant, turn.request.priority or 0)
        #: The conversation's engine-affinity key: one per conversation, inherited by
        #: continuations and forks, so the engine replica and its prefix cache follow it.
        self.conversation_key = ""
        #: Seconds per stage (``validate``, ``render``, ``generate``, ``finalize``).
        self.timings: dict[str, float] = {}
        #: Tokens billed for the turn so far (prompt plus output, compaction summaries included):
        #: what its quota admission is charged when it ends.
        self.billed_tokens = 0

    # -- the three requests a turn can be ------------------------------------------------------

    async def respond(self, emit: Emit) -> ResponseState:
        """Run the turn as a response; its span ends here, however the turn ends."""
        try:
            return await self._stages(emit)
        except asyncio.CancelledError as exc:
            self.span.end("cancelled", exc)
            raise
        except BaseException as exc:  # a ResponsesError: refused before response.created
            status = "rejected" if isinstance(exc, ResponsesError) else "error"
            self.span.end(status, exc)
            self.log(status, error=exc)
            raise

    async def compact(self, seal: Callable[[str, str], Compaction]) -> CompactedResponse:
        """``POST /v1/responses/compact``: the engine summarizes the conversation, and the answer
        is its user messages followed by one compaction item sealing the summary (``seal(summary,
        item id)``). Nothing is stored; the summary's usage is billed under the answer's id."""
        turn = self.turn
        _, after, rendered = await self.prologue(self.route.window)
        self.conversation_key = self._conversation_key()
        conversation = after.context.extend(after.items)
        # The summary is a generation like any other: it waits for an engine slot in its tenant's turn.
        async with engine_slot(self.pipeline.engine_gate, turn.tenant, turn.request.priority or 0):
            summary = await self.summarize(turn.response_id, conversation, rendered.log if rendered else None)
        item = seal(summary.text, new_id("cmp"))
        self.pipeline.metrics.inc("compactions_total", {"transport": turn.transport, "trigger": "compact"})
        return CompactedResponse(
            id=turn.response_id,
            created_at=int(turn.created_at),
            # Messages in the SDK's item shape (content parts, an id, a status), as a listing shows them.
            output=[*(wire_item(m, turn.response_id, i) for i, m in enumerate(user_messages(conversation.items()))), item.wire()],
            usage=summary.usage,
        )

    async def count_prompt(self) -> int:
        """The prompt tokens the engine would receive (``POST /v1/responses/input_tokens``): the
        turn validated and rendered as :meth:`respond` would render it, past the route's context
        window too; nothing generated, stored or billed, and no input hook run."""
        renderer = self.route.renderer
        assert renderer is not None
        _, _, rendered = await self.prologue(sys.maxsize)
        assert rendered is not None
        return rendered.log.num_tokens + len(renderer.generation_prompt)

    # -- prologue: validate → continuation → render ---------------------------------------------

    async def prologue(
        self, window: int, truncate_to: int | None = None, *, response: bool = False
    ) -> tuple[Admitted, Continuation, RenderedPrompt | None]:
        """Validate the new items, find what they continue, render the prompt (``None`` for a
        message-based backend). A ``response`` is validated in its stage with its compaction
        trigger and blocking hooks, and its render is traced; a compaction or a count only validates."""
        t0 = time.perf_counter()
        admitted = await self._admit() if response else self._validate()
        t1 = time.perf_counter()
        self.timings["validate"] = t1 - t0
        after = continuation(self.parent, admitted.items)
        rendered = await self._render(after, window, truncate_to, traced=response)
        self.timings["render"] = time.perf_counter() - t1
        return admitted, after, rendered

    def _validate(self) -> Admitted:
        parent = self.parent
        try:
            open_calls = self.pipeline.validator(
                self.lineage.items, parent.open_calls if parent else {}, accepts_media=self.route.backend.accepts_media
            )
        except ResponsesError as exc:
            raise renumbered(exc, self.lineage.reused_items) from None
        return Admitted(self.lineage.items, open_calls, {})

    async def _admit(self) -> Admitted:
        """Validate only the new items (against the calls the parent left open), then run the
        blocking hooks on them with each hook's carried state. Raises before ``response.created``."""
        turn, parent, lineage = self.turn, self.parent, self.lineage
        try:
            with self.span.stage("validate"):
                open_calls = self.pipeline.validator(
                    lineage.items,
                    parent.open_calls if parent else {},
                    accepts_media=self.route.backend.accepts_media,
                    check_calls=lineage.delegated_parent is None,
                )
            items, triggered = compaction_trigger(lineage.items)
        except ResponsesError as exc:
            raise renumbered(exc, lineage.reused_items) from None
        threshold = compact_threshold(turn.request.context_management)
        if triggered and turn.seal_compaction is None:
            raise invalid_request(
                "Compaction is not available on this server (it has no sealing key).",
                f"input[{lineage.reused_items + len(items)}].type",
                "unsupported_value",
            )
        if turn.seal_compaction is None:
            # Without a key ``context_management`` is accepted and does nothing, as encrypted
            # reasoning is (clients send it by default); a prompt past the window then fails.
            threshold = None
        items, hook_state = await self.pipeline.hooks.run_before(
            self.ctx, items, parent.hook_state if parent else {}, history=parent.conversation if parent else None, span=self.span
        )
        return Admitted(items, open_calls, hook_state, triggered, threshold)

    async def _render(
        self, after: Continuation, window: int, truncate_to: int | None, *, traced: bool
    ) -> RenderedPrompt | None:
        """The prompt's token log: the parent's extended by the new items."""
        turn, route, pipeline = self.turn, self.route, self.pipeline
        if route.renderer is None:
            return None
        source = PromptSource(after.parent, after.context, after.items, turn.request.instructions, turn.tools)
        call = functools.partial(
            render, route.renderer, source,
            context_window=window, truncate_to=truncate_to, truncation_headroom=pipeline.truncation_headroom,
        )
        if not traced:
            return await self._tokenize(after, call)
        with self.span.stage("render") as stage:
            rendered = await self._tokenize(after, call)
            stage.set("responses_cache.render.incremental", rendered.incremental)
        if rendered.kept is not None:
            # ``truncation: "auto"`` dropped items: the kept ones are the conversation's new base.
            pipeline.metrics.inc("truncations_total", {"transport": turn.transport})
            pipeline.metrics.inc("truncated_items_total", {"transport": turn.transport}, rendered.dropped_items)
        return rendered

    async def _tokenize(self, after: Continuation, call: Callable[[], RenderedPrompt]) -> RenderedPrompt:
        """Run a render (``call``) of ``after``'s items: on a worker thread when it tokenizes a lot,
        so one client's huge prompt does not stall every other connection on this event loop.
        Its :class:`ResponsesError` counts the client's input."""
        pipeline = self.pipeline
        try:
            if render_size(after.parent, after.items) < pipeline.offload_chars:
                return call()
            pipeline.metrics.inc("renders_offloaded_total", {"transport": self.turn.transport})
            return await pipeline.tokenizers.run(call)
        except ResponsesError as exc:
            raise renumbered(exc, self.lineage.reused_items) from None

    def _conversation_key(self) -> str:
        parent, turn = self.parent, self.turn
        return (parent.conversation_key if parent else "") or turn.request.prompt_cache_key or turn.response_id

    # -- a response's stages ----------------------------------------------------------------------

    async def _stages(self, emit: Emit) -> ResponseState:
        """The stages in order; each is timed into :attr:`timings` under its name."""
        self.conversation_key = self._conversation_key()
        truncate_to = truncation_budget(self.turn.request, self.route)
        admitted, after, rendered = await self.prologue(self.route.window, truncate_to, response=True)
        t2 = time.perf_counter()
        progress = self._progress(after, admitted, rendered, emit)
        async with self.lease:
            await self._open_engine(progress)
            await self._respond(admitted, progress)
        self.timings["generate"] = time.perf_counter() - t2
        return await self._finish(after, admitted, progress, time.perf_counter())

    def _progress(
        self, after: Continuation, admitted: Admitted, rendered: RenderedPrompt | None, emit: Emit
    ) -> Progress:
        """The response as it starts: nothing output, the context its input makes."""
        turn = self.turn
        context, base = after.context.extend(after.items), after.base
        if rendered is not None and rendered.kept is not None:
            context, base = EMPTY.extend(rendered.kept), rendered.kept
        threshold = admitted.threshold
        return Progress(
            out=OutputBuilder(emit, turn.lane, turn.seal_reasoning),
            rendered=rendered,
            truncated=rendered if rendered is not None and rendered.kept is not None else None,
            context=context,
            base=base,
            hook_state=admitted.hook_state,
            compact_now=turn.request.generate and (
                admitted.triggered or (threshold is not None and rendered is not None and rendered.log.num_tokens > threshold)
            ),
        )

    async def _open_engine(self, progress: Progress) -> None:
        """Wait for an engine slot (when the gate bounds them), start the engine stages and make
        the generation request; a preflight backend opens its stream now, so that its refusal
        is a plain error, with no response."""
        turn, span, call = self.turn, self.span, progress.engine
        if not turn.request.generate:
            return
        if self.pipeline.engine_gate is not None:
            with span.stage("engine.wait"):  # a free engine slot, in the tenant's turn
                await self.lease.take()
        call.span = span.stage("engine")
        call.first_token = span.stage("engine.first_token")
        call.clock.start(turn, call.first_token, self.pipeline.metrics)
        # The engine request continues this trace under the engine stage (the client's own
        # trace context when nothing traces here), so an engine's spans join it.
        trace_context = span.inject(call.span) or turn.trace
        call.generation = self._generation_request(progress.rendered, progress.context, trace_context)
        if isinstance(self.route.backend, PreflightBackend) and not progress.compact_now:
            try:
                call.opened = await self.route.backend.open_stream(call.generation)
            except BaseException as exc:
                call.end(exc)
                raise

    async def _respond(self, admitted: Admitted, progress: Progress) -> None:
        """From ``response.created`` to the output's end: the response exists, and whatever
        happens it gets billed. A failure ends it ``failed``; a cancellation is billed and raised."""
        parent, hooks = self.parent, self.pipeline.hooks
        try:
            await self._created(progress)
            if progress.compact_now:
                await self._compact_first(progress)
            if progress.engine.generation is not None:
                await self._generate_rounds(admitted.items, progress)
            elif hooks.alongside:  # a warm-up generates nothing, but its items are still checked
                progress.late_flag, progress.alongside_state = await hooks.run_alongside(
                    self.ctx, admitted.items, parent.hook_state if parent else {}, history=parent.conversation if parent else None
                )
            await self._close_output(progress)
        except asyncio.CancelledError as exc:
            progress.engine.end(exc)
            self._bill(usage_of(self.turn, self.route, progress), "cancelled")
            self.pipeline.metrics.inc("responses_cancelled_total")
            self.log("cancelled", progress.rendered, error=exc)
            raise
        except Exception as exc:
            self._failed(progress, exc)
        finally:
            call = progress.engine
            if call.opened is not None:  # started, but never streamed
                with contextlib.suppress(Exception):
                    await close_stream(call.opened)
            call.end()  # a response that streamed nothing
            call.clock.stop()

    async def _created(self, progress: Progress) -> None:
        """The response's open entry goes in the journal, then ``response.created`` goes out."""
        journal = self.pipeline.ledger.journal
        if journal is not None:  # in the journal before the client hears of it
            with self.span.stage("journal.open"):
                durable = journal.begin(self.pipeline.ledger.open_entry(self.turn, self.route, progress.rendered))
                if durable is not None:
                    await durable
        response = self.turn.response("in_progress", [])
        await progress.out.send(ev.ResponseCreated(response=response))
        await progress.out.send(ev.ResponseInProgress(response=response))

    def _failed(self, progress: Progress, exc: Exception) -> None:
        progress.engine.end(exc)
        progress.failure = exc
        if isinstance(exc, BackendError):
            code, message = exc.code, str(exc)
        else:
            logger.exception("generation failed for %s", self.turn.response_id)
            code, message = "server_error", "The server had an error while processing your request."
        progress.status, progress.error = "failed", ResponseErrorInfo(code, message)

    async def _generate_rounds(self, items: list[Item], progress: Progress) -> None:
        """Stream the engine; a response kept open by ``response.append`` then waits for the
        outputs of the calls it made, and generates again with them, until it calls nothing."""
        call, parent, turn = progress.engine, self.parent, self.turn
        assert call.generation is not None
        stream, call.opened = call.opened, None  # from here on, the round closes it
        watcher = self._watch(items, parent.hook_state if parent else {}, parent.conversation if parent else None)
        progress.late_flag, progress.alongside_state, progress.finish = await self._stream(progress, watcher, stream, call.clock)
        progress.engine_usage = progress.finish.usage if progress.finish else None
        while turn.append is not None and progress.finish is not None and may_append(
            turn.interrupt, progress.late_flag, progress.finish
        ):
            if not await self._append_round(progress):
                break

    def _watch(self, items: list[Item], carried: Mapping[str, Any], history: Conversation | None) -> Watcher | None:
        """The alongside hooks on ``items`` (with the ``carried`` states, ``history`` before them)."""
        hooks = self.pipeline.hooks
        if not hooks.alongside:
            return None
        return asyncio.ensure_future(hooks.run_alongside(self.ctx, items, carried, history=history))

    async def _stream(
        self,
        progress: Progress,
        watcher: Watcher | None,
        opened: AsyncGenerator[BackendEvent, None] | None = None,
        clock: EngineClock | None = None,
    ) -> tuple[Flag | None, dict[str, Any], Finish | None]:
        """One engine call (the current generation request) into the output (``opened``: the
        preflight stream it already is)."""
        generation = progress.engine.generation
        assert generation is not None
        journal, response_id = self.pipeline.ledger.journal, self.turn.response_id
        mark = None
        if journal is not None:
            mark = (lambda output, reasoning: journal.progress(response_id, output, reasoning)), MARK_EVERY_TOKENS
        stream = opened if opened is not None else self.route.backend.generate(generation)
        on_first = clock.first_event if clock is not None else None
        return await EngineRound(stream, progress.out, watcher, self.turn.interrupt, mark, on_first).run()

    async def _append_round(self, progress: Progress) -> bool:
        """One ``response.append`` round: wait for the outputs of the calls the last engine call
        made (no engine slot held meanwhile), check them with the blocking hooks, append them to
        the token log, and generate again. ``False``: the response ends here."""
        out, append = progress.out, self.turn.append
        assert progress.finish is not None and append is not None
        await out.close()
        calls = calls_since(out, progress.round_start)
        if not calls:
            return False
        await out.send(AwaitingInput(response_id=self.turn.response_id, call_ids=list(calls)))
        async with self.lease.lent():  # no engine slot is held while the client runs its tools
            appended = await append.wait(calls)
        round_items = out.output[progress.round_start :]
        before_append = progress.context.extend(round_items)
        try:
            appended, progress.hook_state = await self.pipeline.hooks.run_before(
                self.ctx, appended, progress.hook_state, history=before_append
            )
        except ResponsesError as exc:  # a blocking hook flagged the appended input:
            # the response ends after its calls, as if nothing had been appended.
            verdict = Verdict(flagged=True, code=exc.code or "content_filter", message=exc.message)
            progress.late_flag = Flag("append", verdict)
            return False
        self._grow(progress, round_items, before_append, appended)
        # Alongside hooks go on from their own state: they see only the appended items.
        parent = self.parent
        carried = {**(parent.hook_state if parent else {}), **progress.alongside_state}
        progress.late_flag, more_state, progress.finish = await self._stream(
            progress, self._watch(appended, carried, before_append)
        )
        progress.alongside_state.update(more_state)
        progress.engine_usage = progress.finish.usage if progress.finish else None
        return True

    def _grow(self, progress: Progress, round_items: list[Any], before_append: Conversation, appended: list[Item]) -> None:
        """The engine call that ended is spent; the next one continues the same response, its
        prompt the last one's with what it sampled and the appended items."""
        route, out, call = self.route, progress.out, progress.engine
        assert progress.finish is not None and call.generation is not None
        used = usage_of(self.turn, route, progress)
        progress.spent = (used.input_tokens, used.input_tokens_details.cached_tokens, used.output_tokens)
        progress.engine_usage = None
        progress.output_start, progress.round_start = out.output_tokens, len(out.output)
        progress.earlier += [*round_items, *appended]
        progress.context = before_append.extend(appended)
        progress.rendered = append_tokens(route, progress.rendered, round_items, progress.finish.token_ids, appended)
        call.generation = dataclasses.replace(
            call.generation,
            conversation=progress.context,
            prompt=Prompt(progress.rendered.log, route.renderer) if progress.rendered is not None and route.renderer else None,
        )
        journal = self.pipeline.ledger.journal
        if journal is not None:  # the input grew: a crash now bills all of it
            grown = usage_of(self.turn, route, progress)
            journal.progress(
                self.turn.response_id, out.output_tokens, out.reasoning_tokens,
                input_tokens=grown.input_tokens, cached_tokens=grown.input_tokens_details.cached_tokens,
            )

    async def _close_output(self, progress: Progress) -> None:
        """Close the open output item, and say why the response ends: a late flag, steering, the
        engine's length or content filter, or completed."""
        out, late_flag, finish, interrupt = progress.out, progress.late_flag, progress.finish, self.turn.interrupt
        if late_flag is not None:
            await out.close("incomplete")
            if self.pipeline.hooks.late_flag == "failed":
                progress.status, progress.error = "failed", ResponseErrorInfo(late_flag.verdict.code, late_flag.verdict.message)
            else:
                progress.status, progress.incomplete = "incomplete", IncompleteDetails("content_filter")
        elif interrupt is not None and interrupt.taken:
            # A message cut by steering is incomplete; reasoning it stopped after is complete.
            await out.close("incomplete" if out.open_kind == "message" else "completed")
            progress.status, progress.incomplete = "incomplete", IncompleteDetails("steered")
            self.pipeline.metrics.inc("responses_steered_total", {"transport": self.turn.transport})
        elif finish is not None and finish.reason in ("length", "content_filter"):
            await out.close("incomplete")
            reason = "max_output_tokens" if finish.reason == "length" else "content_filter"
            progress.status, progress.incomplete = "incomplete", IncompleteDetails(reason)
        else:
            await out.close()

    # -- finish: bill, child state, store, terminal event -----------------------------------------

    async def _finish(self, after: Continuation, admitted: Admitted, progress: Progress, started: float) -> ResponseState:
        """Bill, make the child state, store the response, then send the terminal event."""
        turn, pipeline = self.turn, self.pipeline
        usage = usage_of(turn, self.route, progress)
        final = self._final(progress, usage)
        # Billed before anything below can be interrupted: a disconnect while the response is
        # being stored must not lose its usage record.
        closing = self.span.stage("journal.close") if pipeline.ledger.billing is not None else NO_STAGE
        durable = self._bill(usage, progress.status)
        if durable is None:
            closing.end()
        outcome = Outcome(after, admitted, progress, final, progress.after_input)
        state = child_state(turn, self.lineage, self.route, outcome, self.conversation_key)
        if progress.status != "failed":
            tool_cache.remember(turn.tools)  # only a turn that succeeded may fill the shared cache
            if turn.request.store and pipeline.store is not None:
                await self._store(outcome, state.token_log)
        self.timings["finalize"] = time.perf_counter() - started
        if durable is not None:  # machine durability: the close entry is on disk first
            await durable
            closing.end()
        await self._end(progress, usage, final)
        return state

    def _final(self, progress: Progress, usage: Usage) -> Response:
        """The response object the terminal event carries."""
        final = self.turn.response(
            progress.status, progress.out.output, usage=usage, error=progress.error, incomplete=progress.incomplete,
            completed_at=int(self.pipeline.clock()) if progress.status == "completed" else None,
        )
        truncated = progress.truncated
        if truncated is not None:
            final.truncation_details = TruncationDetails(
                truncated.dropped_items, truncated.untruncated_tokens - truncated.log.num_tokens
            )
        return final

    def _bill(self, usage: Usage, status: str) -> Awaitable[None] | None:
        """Charge the turn (:attr:`billed_tokens`) and bill the response's usage record."""
        self.billed_tokens += usage.input_tokens + usage.output_tokens
        return self.pipeline.ledger.bill(self.turn, self.route, usage, status)

    async def _store(self, outcome: Outcome, log: TokenLog | None) -> None:
        """Store the response (``store: true``). A store failure is logged and counted; the
        response is complete and billed either way."""
        pipeline, turn = self.pipeline, self.turn
        assert pipeline.store is not None
        record = stored_response(turn, self.lineage, outcome, log, pipeline.store.keeps_snapshots)
        try:
            with self.span.stage("store"):
                await pipeline.store.put(record)
        except Exception:  # the response is complete and billed: finish it, unstored
            logger.exception("could not store %s", turn.response_id)
            pipeline.metrics.inc("store_errors_total", {"transport": turn.transport})
        else:
            pipeline.stored_items.add(turn.tenant, (*record.input_items, *outcome.after_input), outcome.final.id)

    async def _end(self, progress: Progress, usage: Usage, final: Response) -> None:
        """Count and log the turn, then send its terminal event; the turn's span ends after it."""
        status, span = progress.status, self.span
        terminal: ev.Event
        if status == "completed":
            terminal = ev.ResponseCompleted(response=final)
        elif status == "incomplete":
            terminal = ev.ResponseIncomplete(response=final)
        else:
            terminal = ev.ResponseFailed(response=final)
        # Counted and logged before the client hears the end (a client that closes at once
        # cancels nothing of that).
        clock = progress.engine.clock
        observe(self.pipeline.metrics, self.turn, progress.rendered, status, self.timings, clock)
        engine_cached = progress.engine_usage.cached_tokens if progress.engine_usage is not None else None
        if span.recording:
            describe(span, progress.rendered, usage, engine_cached)
        self.log(status, progress.rendered, usage, clock=clock, engine_cached=engine_cached, error=progress.failure)
        try:
            await progress.out.send(terminal)
        finally:
            # The turn's spans are made and handed to the exporter once the client has the
            # terminal event: a tracer's work is off the turn's time (and ends them however the
            # send ends, a cancelled send included).
            span.end(status, progress.failure)

    # -- compaction ---------------------------------------------------------------------------------

    async def _compact_first(self, progress: Progress) -> None:
        """An automatic compaction before generating (``context_management``): the engine
        summarizes the context (``response.compaction.compacting`` goes out as it samples), the
        compaction item is output — its summary billed as its own usage record — and becomes the
        conversation's new base; the engine request (and a preflight stream) is made anew on it."""
        turn, route, out, call = self.turn, self.route, progress.out, progress.engine
        assert turn.seal_compaction is not None
        item_id, index, rendered = new_id("cmp"), out.index, progress.rendered

        async def sampled() -> None:
            await out.send(ev.CompactionCompacting(item_id=item_id, output_index=index))

        summary = await self.summarize(item_id, progress.context, rendered.log if rendered else None, on_sample=sampled)
        item = turn.seal_compaction(summary.text, item_id)
        await out.add(item.wire())
        self.pipeline.metrics.inc("compactions_total", {"transport": turn.transport, "trigger": "threshold"})
        compacted = None
        if rendered is not None and route.renderer is not None:  # else a message-based backend: no token log
            log = route.renderer.render_full(turn.request.instructions, turn.tools, [expanded(item)])
            compacted = RenderedPrompt(log, rendered.fingerprint, log.common_prefix(rendered.log), False)
        progress.rendered, progress.context = compacted, EMPTY.extend([item])
        progress.base = list(progress.context.own_items)
        progress.first_output = progress.output_start = progress.round_start = len(out.output)
        if call.generation is not None:
            call.generation = self._generation_request(progress.rendered, progress.context, call.generation.trace_context)
            if isinstance(route.backend, PreflightBackend):  # opened on the compacted log
                call.opened = await route.backend.open_stream(call.generation)

    async def summarize(
        self,
        summary_id: str,
        context: Conversation,
        log: TokenLog | None,
        on_sample: Callable[[], Awaitable[None]] | None = None,
    ) -> Summary:
        """The engine's summary of ``context`` for the turn's tenant and conversation (its
        engine replica and prefix cache), billed as its own usage record (``summary_id``)."""
        turn, route, pipeline = self.turn, self.route, self.pipeline
        conversation_key = self.conversation_key or turn.response_id
        job = SummaryJob(
            response_id=summary_id,
            model=turn.model,
            instructions=turn.request.instructions,
            tools=turn.tools,
            context=context,
            log=log,
            affinity_key=f"{turn.tenant}/{conversation_key}/{route.replica_for(conversation_key)}",
            tenant=turn.tenant,
            cache_salt=tenant_salt(turn.tenant) if pipeline.partition_prefix_cache else None,
            headers=turn.headers,
            max_output_tokens=pipeline.summary_tokens,
        )
        summary = await summarize(route, job, on_sample)
        usage = summary.usage
        self.billed_tokens += usage.input_tokens + usage.output_tokens  # charged to the quota too
        pipeline.ledger.bill_summary(turn, route, summary_id, usage)
        if not summary.text:
            raise BackendError("The engine wrote no summary for the compaction.", code="server_error")
        return summary

    def _generation_request(
        self, rendered: RenderedPrompt | None, context: Conversation, trace_context: Mapping[str, str]
    ) -> GenerationRequest:
        turn, route, request, key = self.turn, self.route, self.turn.request, self.conversation_key
        return GenerationRequest(
            response_id=turn.response_id,
            model=turn.model,
            instructions=request.instructions,
            tools=turn.tools,
            # A message-based backend gets compaction items as the model sees them (their summary).
            conversation=context if route.renderer is not None else expand_conversation(context),
            prompt=Prompt(rendered.log, route.renderer) if rendered is not None and route.renderer else None,
            affinity_key=f"{turn.tenant}/{key}/{route.replica_for(key)}",
            max_output_tokens=request.max_output_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            tool_choice=request.tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            reasoning=request.reasoning,
            metadata=request.metadata or {},
            headers=turn.headers,
            client_fields=client_fields(request),
            previous_response_id=self.lineage.delegated_parent,
            tenant=turn.tenant,
            cache_salt=tenant_salt(turn.tenant) if self.pipeline.partition_prefix_cache else None,
            trace_context=trace_context,
            priority=request.priority,
        )
