"""The pipeline: validate → safety → route → render → generate → finalize → billing.

:meth:`Pipeline.run` executes one turn against its parent state, one named stage after another:
``_admit`` (validate the new items, run the blocking hooks), ``_render`` (extend the parent's
token log), ``_open_engine`` (an engine slot, the generation request), ``_respond`` (from
``response.created`` through the engine's stream and any ``response.append`` rounds) and
``_finalize`` (bill, make the child state, store, send the terminal event). It knows nothing about sockets:
events go out through the ``emit`` callable, and the result is the child
:class:`~responses_cache.state.ResponseState`. A failure before ``response.created`` raises
:class:`~responses_cache.protocol.errors.ResponsesError`; a failure after it ends the response
with ``response.failed`` (the returned state then has status ``failed``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import re
import sys
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from ..backends.base import (
    BackendError,
    BackendEvent,
    EngineUsage,
    Finish,
    GenerationRequest,
    PreflightBackend,
    Prompt,
    ReasoningDelta,
)
from ..billing.journal import OpenEntry
from ..billing.record import UsageRecord
from ..compaction import (
    Compaction,
    expand_conversation,
    expanded,
    history_start,
    replaces_history,
    user_messages,
)
from ..conversation import EMPTY, Conversation
from ..fairness import EngineSlot, FairGate
from ..ids import new_id
from ..listing import wire_item
from ..metrics import Metrics, NullMetrics
from ..protocol import events as ev
from ..protocol.codec import encode
from ..protocol.errors import ResponsesError, invalid_request
from ..protocol.items import CompactionTrigger, CustomToolCall, FunctionCall, Item, WireItem
from ..protocol.request import CreateResponse, client_fields
from ..protocol.response import (
    CompactedResponse,
    IncompleteDetails,
    Response,
    ResponseErrorInfo,
    TruncationDetails,
    Usage,
)
from ..protocol.tools import tool_cache
from ..references import ItemIndex
from ..routing import Route
from ..state import ResponseState, open_calls_after
from ..store import ResponseStore, StoredResponse
from ..tokens.log import TokenLog
from ..tokens.snapshot import delta
from ..tracing import NO_STAGE, NO_TRACER, StageSpan, Tracer, TurnSpan, trace_id_of
from .append import AwaitingInput
from .closing import close_stream
from .compact import DEFAULT_SUMMARY_TOKENS, Summary, compact_threshold, summarize
from .generate import Emit, OutputBuilder
from .hooks import Flag, HookContext, HookRunner, Verdict
from .interrupt import Interrupt
from .render import RenderedPrompt, extend_with_output, render, text_chars
from .turn import Turn
from .validate import Validator

logger = logging.getLogger("responses_cache.pipeline")
#: One record per finished turn (INFO), for ``serve --log-json``'s one JSON line per turn.
turn_logger = logging.getLogger("responses_cache.turns")


_INPUT_INDEX = re.compile(r"input\[(\d+)\]")


def renumbered(exc: ResponsesError, reused: int) -> ResponsesError:
    """``exc`` with its ``input[i]`` param counted in the client's whole input: a full-input
    request matched against the cache runs only its items after the ``reused`` ones."""
    param = exc.param
    if not reused or param is None or (m := _INPUT_INDEX.match(param)) is None:
        return exc
    exc.param = f"input[{int(m.group(1)) + reused}]{param[m.end():]}"
    return exc


def steerable_boundary(out: OutputBuilder, event: object) -> bool:
    """May steering stop the response before ``event``?

    A text message is cut where it is (its text so far is kept). Reasoning and tool calls are
    finished first, and a response that has called a client-owned tool is never cut: it ends
    waiting for the tool's output, and the steering input waits for the client's continuation.
    """
    if any(isinstance(item, (FunctionCall, CustomToolCall)) for item in out.output):
        return False
    kind = out.open_kind
    if kind == "message" or kind is None:
        return True
    if kind == "reasoning":
        return not isinstance(event, ReasoningDelta)  # the next item starts: reasoning is done
    return False  # inside a tool call


def _lower_priority() -> None:
    """Run a tokenizer thread at a lower CPU priority than the event loop (Linux schedules threads
    individually), so a flood of huge prompts slows down its own renders, not every connection."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10))


def tenant_salt(tenant: str) -> str:
    """The engine prefix-cache salt of a tenant: stable, and not the tenant's name."""
    return hashlib.sha256(b"responses-cache/prefix-cache/" + tenant.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclasses.dataclass(frozen=True, slots=True)
class Continuation:
    """What a turn's items continue: the parent to append to (``None``: render in full), the
    context before the items, the items that enter the context, and the new base when an
    automatic compaction's item among them replaced everything before it (``None`` otherwise)."""

    parent: ResponseState | None
    context: Conversation
    items: list[Item]
    base: list[Item] | None


def continuation(parent: ResponseState | None, items: list[Item]) -> Continuation:
    """The latest item made by automatic compaction replaces everything before it (a client may
    resend the items before it or not: the model sees the same conversation)."""
    context = parent.conversation if parent else EMPTY
    start = history_start(items)
    if start or (context.count and items and replaces_history(items[0])):
        return Continuation(None, EMPTY, items[start:], items[start:])
    return Continuation(parent, context, items, None)


def compaction_trigger(items: list[Item]) -> tuple[list[Item], bool]:
    """``items`` without a final ``compaction_trigger`` item, and whether there was one (it
    compacts the context now); one anywhere else is a 400."""
    for index, item in enumerate(items):
        if isinstance(item, CompactionTrigger) and index != len(items) - 1:
            raise invalid_request(
                "A 'compaction_trigger' item must be the final input item.", f"input[{index}].type", "invalid_value"
            )
    if items and isinstance(items[-1], CompactionTrigger):
        return items[:-1], True
    return items, False


def truncation_budget(request: CreateResponse, route: Route) -> int | None:
    """The prompt tokens a ``truncation: "auto"`` request may use (its route's context window,
    less the generation prompt and ``max_output_tokens`` when set); ``None`` without truncation."""
    if request.truncation != "auto" or route.renderer is None:
        return None
    return route.window - len(route.renderer.generation_prompt) - (request.max_output_tokens or 0)


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


#: A progress mark is journaled at each output item's end and after this many output tokens.
MARK_EVERY_TOKENS = 64


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
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.store = store
        #: Stored items by id (tenant-scoped), for ``item_reference`` inputs: each entry names the
        #: stored response that holds the item.
        self.stored_items = ItemIndex(max_indexed_items)
        self.hooks = hooks or HookRunner()
        self.validator = validator or Validator()
        self.billing = billing
        self.journal = billing if isinstance(billing, UsageJournalWriter) else None
        self.metrics = metrics or NullMetrics()
        #: Spans per turn and stage (:mod:`responses_cache.tracing`; nothing by default).
        self.tracer = tracer or NO_TRACER
        self.clock = clock

    async def run(self, turn: Turn, parent: ResponseState | None, route: Route, emit: Emit) -> ResponseState:
        """Run the turn; its span (``turn.span``) ends here, however the turn ends."""
        span = turn.span
        try:
            return await self._run(turn, parent, route, emit, span)
        except asyncio.CancelledError as exc:
            span.end("cancelled", exc)
            raise
        except BaseException as exc:  # a ResponsesError: refused before response.created
            status = "rejected" if isinstance(exc, ResponsesError) else "error"
            span.end(status, exc)
            self._log_turn(turn, status, None, None, error=exc)
            raise

    async def _run(
        self, turn: Turn, parent: ResponseState | None, route: Route, emit: Emit, span: TurnSpan
    ) -> ResponseState:
        """The stages in order; each is timed into ``turn.timings`` under its name."""
        timings = turn.timings
        t0 = time.perf_counter()
        ctx = HookContext(turn.tenant, turn.model, turn.response_id, turn.lane, turn.transport)
        # One key per conversation, inherited by continuations and forks: the engine replica and
        # its prefix cache follow the conversation, whichever connection or lane carries it.
        turn.conversation_key = (parent.conversation_key if parent else "") or turn.request.prompt_cache_key or turn.response_id
        admitted = await self._admit(turn, parent, route, ctx, span)
        t1 = time.perf_counter()
        timings["validate"] = t1 - t0
        after = continuation(parent, admitted.items)
        rendered = await self._render(turn, route, after, span)
        t2 = time.perf_counter()
        timings["render"] = t2 - t1
        progress = self._progress(turn, after, admitted, rendered, emit)
        await self._open_engine(turn, route, progress, span)
        await self._respond(turn, parent, route, ctx, admitted, progress, span)
        timings["generate"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        return await self._finalize(turn, parent, route, after, admitted, progress, span, t3)

    async def _admit(
        self, turn: Turn, parent: ResponseState | None, route: Route, ctx: HookContext, span: TurnSpan
    ) -> _Admitted:
        """Validate only the new items (against the calls the parent left open), then run the
        blocking hooks on them with each hook's carried state. Raises before ``response.created``."""
        try:
            with span.stage("validate"):
                open_calls = self.validator(
                    turn.items,
                    parent.open_calls if parent else {},
                    accepts_media=route.backend.accepts_media,
                    check_calls=turn.delegated_parent is None,
                )
            turn.items, triggered = compaction_trigger(turn.items)
        except ResponsesError as exc:
            raise renumbered(exc, turn.reused_items) from None
        threshold = compact_threshold(turn.request.context_management)
        if triggered and turn.seal_compaction is None:
            raise invalid_request(
                "Compaction is not available on this server (it has no sealing key).",
                f"input[{turn.reused_items + len(turn.items)}].type",
                "unsupported_value",
            )
        if turn.seal_compaction is None:
            # Without a key ``context_management`` is accepted and does nothing, as encrypted
            # reasoning is (clients send it by default); a prompt past the window then fails.
            threshold = None
        items, hook_state = await self.hooks.run_before(
            ctx, turn.items, parent.hook_state if parent else {}, history=parent.conversation if parent else None, span=span
        )
        return _Admitted(items, open_calls, hook_state, triggered, threshold)

    async def _render(self, turn: Turn, route: Route, after: Continuation, span: TurnSpan) -> RenderedPrompt | None:
        """The prompt's token log: the parent's extended by the new items (``None`` for a
        message-based backend, which renders nothing here)."""
        if route.renderer is None:
            return None
        call = functools.partial(
            render, route.renderer, after.parent, after.context, after.items, turn.request.instructions, turn.tools,
            context_window=route.window, truncate_to=truncation_budget(turn.request, route),
            truncation_headroom=self.truncation_headroom,
        )
        with span.stage("render") as stage:
            rendered = await self._tokenize(turn, after, call)
            stage.set("responses_cache.render.incremental", rendered.incremental)
        if rendered.kept is not None:
            # ``truncation: "auto"`` dropped items: the kept ones are the conversation's new base.
            self.metrics.inc("truncations_total", {"transport": turn.transport})
            self.metrics.inc("truncated_items_total", {"transport": turn.transport}, rendered.dropped_items)
        return rendered

    async def _tokenize(self, turn: Turn, after: Continuation, call: Callable[[], RenderedPrompt]) -> RenderedPrompt:
        """Run a render (``call``) of ``after``'s items: on a worker thread when it tokenizes a lot
        (tiktoken releases the GIL), so one client's huge prompt does not stall every other
        connection on this event loop. Its :class:`ResponsesError` counts the client's input."""
        try:
            if self._render_size(after.parent, after.items) < self.offload_chars:
                return call()
            self.metrics.inc("renders_offloaded_total", {"transport": turn.transport})
            return await asyncio.get_running_loop().run_in_executor(self._tokenizers(), call)
        except ResponsesError as exc:
            raise renumbered(exc, turn.reused_items) from None

    def _progress(
        self, turn: Turn, after: Continuation, admitted: _Admitted, rendered: RenderedPrompt | None, emit: Emit
    ) -> _Progress:
        """The response as it starts: nothing output, the context its input makes."""
        context, base = after.context.extend(after.items), after.base
        if rendered is not None and rendered.kept is not None:
            context, base = EMPTY.extend(rendered.kept), rendered.kept
        threshold = admitted.threshold
        return _Progress(
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

    async def _open_engine(self, turn: Turn, route: Route, progress: _Progress, span: TurnSpan) -> None:
        """Wait for an engine slot (when the gate bounds them), start the engine stages and make
        the generation request; a preflight backend opens its stream now, so that its refusal
        is a plain error, with no response."""
        if not turn.request.generate:
            return
        if self.engine_gate is not None:
            with span.stage("engine.wait"):  # a free engine slot, in the tenant's turn
                progress.slot = await self.engine_gate.acquire(turn.tenant, turn.request.priority or 0)
        progress.engine = span.stage("engine")
        progress.first_token = span.stage("engine.first_token")
        progress.clock.start(turn, progress.first_token, self.metrics)
        # The engine request continues this trace under the engine stage (the client's own
        # trace context when nothing traces here), so an engine's spans join it.
        trace_context = span.inject(progress.engine) or turn.trace
        progress.generation = self._generation_request(turn, route, progress.rendered, progress.context, trace_context)
        if isinstance(route.backend, PreflightBackend) and not progress.compact_now:
            try:
                progress.opened = await route.backend.open_stream(progress.generation)
            except BaseException as exc:
                progress.end_engine(exc)
                if progress.slot is not None:
                    progress.slot.release()
                raise

    async def _respond(
        self,
        turn: Turn,
        parent: ResponseState | None,
        route: Route,
        ctx: HookContext,
        admitted: _Admitted,
        progress: _Progress,
        span: TurnSpan,
    ) -> None:
        """From ``response.created`` to the output's end: the response exists, and whatever
        happens it gets billed. A failure ends it ``failed``; a cancellation is billed and raised."""
        out = progress.out
        try:
            # Its open entry is in the journal before the client hears of it.
            if self.journal is not None:
                with span.stage("journal.open"):
                    durable = self.journal.begin(self._open_entry(turn, route, progress.rendered))
                    if durable is not None:
                        await durable
            response = turn.response("in_progress", [])
            await out.send(ev.ResponseCreated(response=response))
            await out.send(ev.ResponseInProgress(response=response))
            if progress.compact_now:
                await self._compact_first(turn, route, progress)
            if progress.generation is not None:
                await self._generate_rounds(turn, parent, route, ctx, admitted.items, progress)
            elif self.hooks.alongside:  # a warm-up generates nothing, but its items are still checked
                progress.late_flag, progress.alongside_state = await self.hooks.run_alongside(
                    ctx, admitted.items, parent.hook_state if parent else {}, history=parent.conversation if parent else None
                )
            await self._close_output(turn, progress)
        except asyncio.CancelledError as exc:
            progress.end_engine(exc)
            self._bill(turn, route, self._usage(turn, route, progress), "cancelled")
            self.metrics.inc("responses_cancelled_total")
            self._log_turn(turn, "cancelled", progress.rendered, None, error=exc)
            raise
        except Exception as exc:
            progress.end_engine(exc)
            progress.failure = exc
            if isinstance(exc, BackendError):
                code, message = exc.code, str(exc)
            else:
                logger.exception("generation failed for %s", turn.response_id)
                code, message = "server_error", "The server had an error while processing your request."
            progress.status, progress.error = "failed", ResponseErrorInfo(code, message)
        finally:
            if progress.opened is not None:  # started, but never handed to _generate
                with contextlib.suppress(Exception):
                    await close_stream(progress.opened)
            progress.end_engine()  # a response that streamed nothing
            progress.clock.stop()
            if progress.slot is not None:
                progress.slot.release()

    async def _compact_first(self, turn: Turn, route: Route, progress: _Progress) -> None:
        """An automatic compaction before generating: its item is the first output and the
        conversation's new base; the engine request (and a preflight stream) is made anew on it."""
        progress.rendered, progress.context = await self._compact(turn, route, progress.rendered, progress.context, progress.out)
        progress.base = list(progress.context.own_items)
        progress.first_output = progress.output_start = progress.round_start = len(progress.out.output)
        if progress.generation is not None:
            progress.generation = self._generation_request(
                turn, route, progress.rendered, progress.context, progress.generation.trace_context
            )
            if isinstance(route.backend, PreflightBackend):  # opened on the compacted log
                progress.opened = await route.backend.open_stream(progress.generation)

    async def _generate_rounds(
        self,
        turn: Turn,
        parent: ResponseState | None,
        route: Route,
        ctx: HookContext,
        items: list[Item],
        progress: _Progress,
    ) -> None:
        """Stream the engine; a response kept open by ``response.append`` then waits for the
        outputs of the calls it made, and generates again with them, until it calls nothing."""
        assert progress.generation is not None
        stream, progress.opened = progress.opened, None  # from here on, _generate closes it
        history = parent.conversation if parent else None
        progress.late_flag, progress.alongside_state, progress.finish = await self._generate(
            route, progress.generation, progress.out, ctx, items, parent.hook_state if parent else {}, history,
            turn.response_id, turn.interrupt, stream, progress.clock,
        )
        progress.engine_usage = progress.finish.usage if progress.finish else None
        while turn.append is not None and progress.finish is not None and self._may_append(turn, progress.late_flag, progress.finish):
            if not await self._append_round(turn, parent, route, ctx, progress):
                break

    async def _append_round(
        self, turn: Turn, parent: ResponseState | None, route: Route, ctx: HookContext, progress: _Progress
    ) -> bool:
        """One ``response.append`` round: wait for the outputs of the calls the last engine call
        made (no engine slot held meanwhile), check them with the blocking hooks, append them to
        the token log, and generate again. ``False``: the response ends here."""
        assert progress.generation is not None and progress.finish is not None and turn.append is not None
        out = progress.out
        await out.close()
        calls = self._calls_since(out, progress.round_start)
        if not calls:
            return False
        await out.send(AwaitingInput(response_id=turn.response_id, call_ids=list(calls)))
        if progress.slot is not None:  # no engine slot is held while the client runs its tools
            progress.slot.release()
            progress.slot = None
        appended = await turn.append.wait(calls)
        if self.engine_gate is not None:
            progress.slot = await self.engine_gate.acquire(turn.tenant, turn.request.priority or 0)
        round_items = out.output[progress.round_start :]
        before_append = progress.context.extend(round_items)
        try:
            appended, progress.hook_state = await self.hooks.run_before(ctx, appended, progress.hook_state, history=before_append)
        except ResponsesError as exc:  # a blocking hook flagged the appended input:
            # the response ends after its calls, as if nothing had been appended.
            verdict = Verdict(flagged=True, code=exc.code or "content_filter", message=exc.message)
            progress.late_flag = Flag("append", verdict)
            return False
        # The engine call that ended is spent; the next one continues the same response.
        used = self._usage(turn, route, progress)
        progress.spent = (used.input_tokens, used.input_tokens_details.cached_tokens, used.output_tokens)
        progress.engine_usage = None
        progress.output_start, progress.round_start = out.output_tokens, len(out.output)
        progress.earlier += [*round_items, *appended]
        progress.context = before_append.extend(appended)
        progress.rendered = self._append_tokens(route, progress.rendered, round_items, progress.finish.token_ids, appended)
        progress.generation = dataclasses.replace(
            progress.generation,
            conversation=progress.context,
            prompt=Prompt(progress.rendered.log, route.renderer) if progress.rendered is not None and route.renderer else None,
        )
        if self.journal is not None:  # the input grew: a crash now bills all of it
            grown = self._usage(turn, route, progress)
            self.journal.progress(
                turn.response_id, out.output_tokens, out.reasoning_tokens,
                input_tokens=grown.input_tokens, cached_tokens=grown.input_tokens_details.cached_tokens,
            )
        # Alongside hooks go on from their own state: they see only the appended items.
        carried = {**(parent.hook_state if parent else {}), **progress.alongside_state}
        progress.late_flag, more_state, progress.finish = await self._generate(
            route, progress.generation, out, ctx, appended, carried, before_append, turn.response_id, turn.interrupt
        )
        progress.alongside_state.update(more_state)
        progress.engine_usage = progress.finish.usage if progress.finish else None
        return True

    async def _close_output(self, turn: Turn, progress: _Progress) -> None:
        """Close the open output item, and say why the response ends: a late flag, steering, the
        engine's length or content filter, or completed."""
        out, late_flag, finish = progress.out, progress.late_flag, progress.finish
        if late_flag is not None:
            await out.close("incomplete")
            if self.hooks.late_flag == "failed":
                progress.status, progress.error = "failed", ResponseErrorInfo(late_flag.verdict.code, late_flag.verdict.message)
            else:
                progress.status, progress.incomplete = "incomplete", IncompleteDetails("content_filter")
        elif turn.interrupt is not None and turn.interrupt.taken:
            # A message cut by steering is incomplete; reasoning it stopped after is complete.
            await out.close("incomplete" if out.open_kind == "message" else "completed")
            progress.status, progress.incomplete = "incomplete", IncompleteDetails("steered")
            self.metrics.inc("responses_steered_total", {"transport": turn.transport})
        elif finish is not None and finish.reason in ("length", "content_filter"):
            await out.close("incomplete")
            reason = "max_output_tokens" if finish.reason == "length" else "content_filter"
            progress.status, progress.incomplete = "incomplete", IncompleteDetails(reason)
        else:
            await out.close()

    async def _finalize(
        self,
        turn: Turn,
        parent: ResponseState | None,
        route: Route,
        after: Continuation,
        admitted: _Admitted,
        progress: _Progress,
        span: TurnSpan,
        started: float,
    ) -> ResponseState:
        """Bill, make the child state, store the response, then send the terminal event."""
        usage = self._usage(turn, route, progress)
        truncated = progress.truncated
        final = turn.response(
            progress.status, progress.out.output, usage=usage, error=progress.error, incomplete=progress.incomplete,
            completed_at=int(self.clock()) if progress.status == "completed" else None,
        )
        if truncated is not None:
            final.truncation_details = TruncationDetails(
                truncated.dropped_items, truncated.untruncated_tokens - truncated.log.num_tokens
            )
        # Billed before anything below can be interrupted: a disconnect while the response is
        # being stored must not lose its usage record.
        closing = span.stage("journal.close") if self.billing is not None else NO_STAGE
        durable = self._bill(turn, route, usage, progress.status)
        if durable is None:
            closing.end()
        after_input = progress.after_input
        state = self._child_state(turn, parent, route, after, admitted, progress, after_input, final, truncated)
        if progress.status != "failed":
            tool_cache.remember(turn.tools)  # only a turn that succeeded may fill the shared cache
            if turn.request.store and self.store is not None:
                await self._store(turn, parent, after, admitted.items, progress, after_input, final, state.token_log, span)
        turn.timings["finalize"] = time.perf_counter() - started
        if durable is not None:  # machine durability: the close entry is on disk first
            await durable
            closing.end()
        await self._end(turn, progress, usage, final, span)
        return state

    def _child_state(
        self,
        turn: Turn,
        parent: ResponseState | None,
        route: Route,
        after: Continuation,
        admitted: _Admitted,
        progress: _Progress,
        after_input: list[Item],
        final: Response,
        truncated: RenderedPrompt | None,
    ) -> ResponseState:
        """The state a continuation of this response starts from: it shares everything it can
        with its parent (the conversation, the token log extended by the output)."""
        request, rendered, out = turn.request, progress.rendered, progress.out
        log = None
        if rendered is not None and route.renderer is not None and progress.status != "failed":
            log = extend_with_output(
                route.renderer, rendered.log, out.output[progress.round_start :],
                progress.finish.token_ids if progress.finish else None,
            )
        base = progress.base
        own_items: list[Item] = [*admitted.items, *after_input]
        return ResponseState(
            response=final,
            tenant=turn.tenant,
            lane=turn.lane,
            conversation=progress.context.extend(out.output[progress.round_start :]),
            instructions=request.instructions,
            tools=turn.tools,
            fingerprint=rendered.fingerprint if rendered else None,
            token_log=log,
            route=route,
            open_calls=open_calls_after(admitted.open_calls if base is None else open_calls_after({}, base), after_input),
            hook_state={**progress.hook_state, **progress.alongside_state},
            conversation_key=turn.conversation_key,
            total_bytes=(
                (parent.total_bytes if parent else 0) + sum(len(encode(i)) for i in own_items)
                if base is None
                else sum(len(encode(i)) for i in (*base, *after_input))
            ),
            **self._client_view(parent, after, truncated, base),
        )

    async def _store(
        self,
        turn: Turn,
        parent: ResponseState | None,
        after: Continuation,
        items: list[Item],
        progress: _Progress,
        after_input: list[Item],
        final: Response,
        log: TokenLog | None,
        span: TurnSpan,
    ) -> None:
        """Store the response (``store: true``): its input, its output with any appended tool
        outputs where they came, and the token-log segments this turn added. A store failure is
        logged and counted; the response is complete and billed either way."""
        assert self.store is not None
        rendered, out = progress.rendered, progress.out
        # A full-input request matched against the cache has no previous_response_id: store the
        # whole input it carried (the reused prefix too), or hydrating it would lose that prefix.
        stored_input = (*after.context.items(), *items) if turn.reused_items else tuple(items)
        snapshot = None
        if log is not None and rendered is not None and self.store.keeps_snapshots:
            # The segments this turn added; a root (header and every item) when the log was
            # rendered from scratch or this response starts its own stored chain.
            since = None
            if rendered.incremental and not turn.reused_items and parent is not None and parent.token_log is not None:
                since = parent.token_log.num_items
            snapshot = delta(log, since)
        # A response that took appends is stored with them in its output, where they came, so
        # that a continuation hydrated from the store sees the conversation the model saw.
        # (An automatic compaction's item stays first, where the client saw it.)
        stored = (
            msgspec.structs.replace(final, output=[*out.output[: progress.first_output], *after_input])
            if progress.round_start != progress.first_output
            else final
        )
        try:
            with span.stage("store"):
                await self.store.put(
                    StoredResponse(turn.tenant, stored, stored_input, turn.request.instructions, turn.tools.raw, snapshot)
                )
        except Exception:  # the response is complete and billed: finish it, unstored
            logger.exception("could not store %s", turn.response_id)
            self.metrics.inc("store_errors_total", {"transport": turn.transport})
        else:
            self.stored_items.add(turn.tenant, (*stored_input, *after_input), final.id)

    async def _end(self, turn: Turn, progress: _Progress, usage: Usage, final: Response, span: TurnSpan) -> None:
        """Count and log the turn, then send its terminal event; the turn's span ends after it."""
        status = progress.status
        terminal: ev.Event
        if status == "completed":
            terminal = ev.ResponseCompleted(response=final)
        elif status == "incomplete":
            terminal = ev.ResponseIncomplete(response=final)
        else:
            terminal = ev.ResponseFailed(response=final)
        # Counted and logged before the client hears the end (a client that closes at once
        # cancels nothing of that).
        self._observe(turn, progress.rendered, status, progress.clock)
        engine_cached = progress.engine_usage.cached_tokens if progress.engine_usage is not None else None
        if span.recording:
            self._describe(span, turn, progress.rendered, usage, engine_cached)
        self._log_turn(
            turn, status, progress.rendered, usage, clock=progress.clock, engine_cached=engine_cached, error=progress.failure
        )
        try:
            await progress.out.send(terminal)
        finally:
            # The turn's spans are made and handed to the exporter once the client has the
            # terminal event: a tracer's work is off the turn's time (and ends them however the
            # send ends, a cancelled send included).
            span.end(status, progress.failure)

    @staticmethod
    def _client_view(
        parent: ResponseState | None, after: Continuation, truncated: RenderedPrompt | None, base: list[Item] | None
    ) -> dict[str, int]:
        """Where the child's conversation starts in the client's (see ``ResponseState.client_offset``):
        the parent's, moved on by a cut; reset by a compaction (its item is where a resend is
        matched from)."""
        offset, ahead = (parent.client_offset, parent.kept_ahead) if parent is not None and after.base is None else (0, 0)
        if truncated is not None:
            offset += truncated.dropped_items + truncated.kept_ahead - ahead
            ahead = truncated.kept_ahead
        elif base is not None:
            offset = ahead = 0
        return {"client_offset": offset, "kept_ahead": ahead}

    async def _compact(
        self, turn: Turn, route: Route, rendered: RenderedPrompt | None, context: Conversation, out: OutputBuilder
    ) -> tuple[RenderedPrompt | None, Conversation]:
        """Automatic compaction (``context_management``): the engine summarizes ``context``
        (``response.compaction.compacting`` goes out as it samples), the compaction item is
        output, billed as its own usage record, and becomes the conversation's new base: the
        prompt is a full render of it, and the response is generated from there."""
        assert turn.seal_compaction is not None
        item_id = new_id("cmp")
        index = out.index

        async def sampled() -> None:
            await out.send(ev.CompactionCompacting(item_id=item_id, output_index=index))

        summary = await self.summarize(turn, route, item_id, context, rendered.log if rendered else None, on_sample=sampled)
        item = turn.seal_compaction(summary.text, item_id)
        await out.add(item.wire())
        self.metrics.inc("compactions_total", {"transport": turn.transport, "trigger": "threshold"})
        if rendered is None or route.renderer is None:  # a message-based backend: no token log
            return None, EMPTY.extend([item])
        log = route.renderer.render_full(turn.request.instructions, turn.tools, [expanded(item)])
        cached = log.common_prefix(rendered.log)
        return RenderedPrompt(log, rendered.fingerprint, cached, False), EMPTY.extend([item])

    async def summarize(
        self,
        turn: Turn,
        route: Route,
        summary_id: str,
        context: Conversation,
        log: TokenLog | None,
        on_sample: Callable[[], Awaitable[None]] | None = None,
    ) -> Summary:
        """The engine's summary of ``context`` for ``turn``'s tenant and conversation (its
        engine replica and prefix cache), billed as its own usage record (``summary_id``)."""
        conversation_key = turn.conversation_key or turn.response_id
        summary = await summarize(
            route,
            response_id=summary_id,
            model=turn.model,
            instructions=turn.request.instructions,
            tools=turn.tools,
            context=context,
            log=log,
            affinity_key=f"{turn.tenant}/{conversation_key}/{route.replica_for(conversation_key)}",
            tenant=turn.tenant,
            cache_salt=tenant_salt(turn.tenant) if self.partition_prefix_cache else None,
            headers=turn.headers,
            max_output_tokens=self.summary_tokens,
            on_sample=on_sample,
        )
        self._bill_summary(turn, route, summary_id, summary.usage)
        if not summary.text:
            raise BackendError("The engine wrote no summary for the compaction.", code="server_error")
        return summary

    def _bill_summary(self, turn: Turn, route: Route, summary_id: str, usage: Usage) -> None:
        """A compaction's usage: a record of its own (its id), apart from any response's."""
        turn.billed_tokens += usage.input_tokens + usage.output_tokens  # charged to the quota too
        if self.billing is None:
            return
        try:
            self.billing.submit(self._record(turn, route, summary_id, "completed", usage))
        except Exception:  # billing must never break a turn; the biller keeps what it can
            logger.exception("could not submit the usage record of compaction %s", summary_id)

    async def compact(
        self, turn: Turn, parent: ResponseState | None, route: Route, seal: Callable[[str, str], Compaction]
    ) -> CompactedResponse:
        """``POST /v1/responses/compact``: the engine summarizes the conversation (``turn``'s input
        after ``parent``'s), and the answer is its user messages followed by one compaction item
        sealing the summary (``seal(summary, item id)``). Nothing is stored; the summary's usage
        is billed under the answer's id."""
        try:
            self.validator(turn.items, parent.open_calls if parent else {}, accepts_media=route.backend.accepts_media)
        except ResponsesError as exc:
            raise renumbered(exc, turn.reused_items) from None
        turn.conversation_key = (parent.conversation_key if parent else "") or turn.request.prompt_cache_key or turn.response_id
        after = continuation(parent, turn.items)
        log = None
        if route.renderer is not None:
            call = functools.partial(
                render, route.renderer, after.parent, after.context, after.items, turn.request.instructions, turn.tools,
                context_window=route.window,
            )
            log = (await self._tokenize(turn, after, call)).log
        conversation = after.context.extend(after.items)
        # The summary is a generation like any other: it waits for an engine slot in its tenant's turn.
        slot = await self.engine_gate.acquire(turn.tenant, turn.request.priority or 0) if self.engine_gate is not None else None
        try:
            summary = await self.summarize(turn, route, turn.response_id, conversation, log)
        finally:
            if slot is not None:
                slot.release()
        item = seal(summary.text, new_id("cmp"))
        self.metrics.inc("compactions_total", {"transport": turn.transport, "trigger": "compact"})
        return CompactedResponse(
            id=turn.response_id,
            created_at=int(turn.created_at),
            # Messages in the SDK's item shape (content parts, an id, a status), as a listing shows them.
            output=[*(wire_item(m, turn.response_id, i) for i, m in enumerate(user_messages(conversation.items()))), item.wire()],
            usage=summary.usage,
        )

    async def count_prompt(self, turn: Turn, parent: ResponseState | None, route: Route) -> int:
        """The prompt tokens the engine would receive for ``turn`` (``POST /v1/responses/input_tokens``):
        the turn is validated and rendered as :meth:`run` would render it — appended to the
        parent's token log when it has one — but nothing is generated, stored or billed. Input
        safety hooks are not run (a hook that rewrites input could change the count). The count
        is given even past the route's context window."""
        assert route.renderer is not None
        try:
            self.validator(turn.items, parent.open_calls if parent else {}, accepts_media=route.backend.accepts_media)
        except ResponsesError as exc:
            raise renumbered(exc, turn.reused_items) from None
        after = continuation(parent, turn.items)
        call = functools.partial(
            render, route.renderer, after.parent, after.context, after.items, turn.request.instructions, turn.tools,
            context_window=sys.maxsize,
        )
        rendered = await self._tokenize(turn, after, call)
        return rendered.log.num_tokens + len(route.renderer.generation_prompt)

    def _tokenizers(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.tokenizer_threads, thread_name_prefix="responses-cache-render", initializer=_lower_priority
            )
        return self._executor

    def close(self) -> None:
        """Stop the tokenizer threads (idle ones exit at once; running renders finish)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    async def aclose(self) -> None:
        """:meth:`close`, as the owning service's lifecycle calls it."""
        self.close()

    @staticmethod
    def _may_append(turn: Turn, late_flag: Flag | None, finish: Finish) -> bool:
        """May a response that opted in to ``response.append`` wait for input now (its engine call
        ended normally: not flagged, cut by length, or steered)?"""
        if late_flag is not None or finish.reason in ("length", "content_filter"):
            return False
        return turn.interrupt is None or not turn.interrupt.taken

    @staticmethod
    def _calls_since(out: OutputBuilder, start: int) -> tuple[str, ...]:
        """The function calls the output made since ``start`` (none when it called a custom tool,
        whose output cannot be appended: the response then ends as usual)."""
        produced = out.output[start:]
        if any(isinstance(i, CustomToolCall) for i in produced):
            return ()
        return tuple(i.call_id for i in produced if isinstance(i, FunctionCall))

    @staticmethod
    def _append_tokens(
        route: Route, rendered: RenderedPrompt | None, output: list[WireItem], sampled: Sequence[int] | None, appended: list[Item]
    ) -> RenderedPrompt | None:
        """The next engine call's prompt: the last one's, plus what it sampled, plus the appended
        tool outputs (appended to the token log, never re-rendered)."""
        if rendered is None or route.renderer is None:
            return None
        with_output = extend_with_output(route.renderer, rendered.log, output, sampled)
        log = route.renderer.extend(with_output, appended)
        if log.num_tokens > route.window:
            raise BackendError(
                f"This model's maximum context length is {route.window} tokens; the appended input "
                f"made the response's context {log.num_tokens} tokens.",
                code="context_length_exceeded",
            )
        return RenderedPrompt(log, rendered.fingerprint, log.common_prefix(with_output), True)

    @staticmethod
    def _render_size(parent: ResponseState | None, items: list[Item]) -> int:
        """Characters a render will tokenize, about: the new items, plus the whole history when the
        parent has no token log to extend (a full render)."""
        size = text_chars(items)
        if parent is not None and parent.token_log is None:
            size += parent.total_bytes
        return size

    def _generation_request(
        self,
        turn: Turn,
        route: Route,
        rendered: RenderedPrompt | None,
        context: Conversation,
        trace_context: Mapping[str, str],
    ) -> GenerationRequest:
        request = turn.request
        return GenerationRequest(
            response_id=turn.response_id,
            model=turn.model,
            instructions=request.instructions,
            tools=turn.tools,
            # A message-based backend gets compaction items as the model sees them (their summary).
            conversation=context if route.renderer is not None else expand_conversation(context),
            prompt=Prompt(rendered.log, route.renderer) if rendered is not None and route.renderer else None,
            affinity_key=f"{turn.tenant}/{turn.conversation_key}/{route.replica_for(turn.conversation_key)}",
            max_output_tokens=request.max_output_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            tool_choice=request.tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            reasoning=request.reasoning,
            metadata=request.metadata or {},
            headers=turn.headers,
            client_fields=client_fields(request),
            previous_response_id=turn.delegated_parent,
            tenant=turn.tenant,
            cache_salt=tenant_salt(turn.tenant) if self.partition_prefix_cache else None,
            trace_context=trace_context,
            priority=request.priority,
        )

    async def _generate(
        self,
        route: Route,
        generation: GenerationRequest,
        out: OutputBuilder,
        ctx: HookContext,
        items: list[Item],
        carried: Mapping[str, Any],
        history: Conversation | None,
        response_id: str,
        interrupt: Interrupt | None = None,
        opened: AsyncGenerator[BackendEvent, None] | None = None,
        clock: _EngineClock | None = None,
    ) -> tuple[Flag | None, dict[str, Any], Finish | None]:
        """Stream the backend; alongside hooks run concurrently (on ``items``, with the ``carried``
        hook states, ``history`` before them) and a flag stops generation, as does steering
        (``interrupt``) at the next safe boundary."""
        hooks = self.hooks
        watcher: asyncio.Task[tuple[Flag | None, dict[str, Any]]] | None = None
        if hooks.alongside:
            watcher = asyncio.ensure_future(hooks.run_alongside(ctx, items, carried, history=history))
        finish: Finish | None = None
        states: dict[str, Any] = {}
        journal = self.journal
        marked_items = marked_tokens = 0
        stream = opened if opened is not None else route.backend.generate(generation)
        events = stream.__aiter__()
        #: The backend step racing the hooks, while one is in flight: it must end before the
        #: stream is closed (closing a generator that is still running raises RuntimeError).
        step: asyncio.Future[BackendEvent] | None = None
        try:
            while True:
                try:
                    if watcher is None:
                        event = await events.__anext__()
                    else:
                        # Race the next event against the hooks, so a flag stops a stalled engine too.
                        step = asyncio.ensure_future(events.__anext__())
                        await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
                        if watcher.done():
                            flag, states = watcher.result()
                            watcher = None
                            if flag is not None:
                                return flag, states, None
                        event = await step
                        step = None
                except StopAsyncIteration:
                    break
                if clock is not None:
                    clock.first_event()
                    clock = None
                if isinstance(event, Finish):
                    finish = event
                    break
                if interrupt is not None and interrupt.requested and steerable_boundary(out, event):
                    interrupt.taken = True
                    break  # closing the stream below aborts the engine's request
                await out.feed(event)
                if journal is not None and (
                    len(out.output) != marked_items or out.output_tokens - marked_tokens >= MARK_EVERY_TOKENS
                ):
                    marked_items, marked_tokens = len(out.output), out.output_tokens
                    journal.progress(response_id, out.output_tokens, out.reasoning_tokens)
        finally:
            if step is not None and not step.done():
                step.cancel()  # the cancellation reaches the backend's generator at its await
            if step is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await step
            try:
                await close_stream(stream)  # to the end, even if the turn is cancelled again meanwhile
            finally:
                if watcher is not None and finish is None:
                    watcher.cancel()
        if watcher is not None:
            flag, states = await watcher
            return flag, states, finish
        return None, states, finish

    @staticmethod
    def _prompt_tokens(turn: Turn, route: Route, rendered: RenderedPrompt | None) -> tuple[int, int]:
        """``(input_tokens, cached_tokens)`` as known before generation (0 without a renderer)."""
        if not turn.request.generate or rendered is None or route.renderer is None:
            return 0, 0
        return rendered.log.num_tokens + len(route.renderer.generation_prompt), rendered.cached_tokens

    def _open_entry(self, turn: Turn, route: Route, rendered: RenderedPrompt | None) -> OpenEntry:
        prompt, cached = self._prompt_tokens(turn, route, rendered)
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

    @staticmethod
    def _usage(turn: Turn, route: Route, progress: _Progress) -> Usage:
        """``input_tokens`` is the prompt the engine saw (log + generation prompt); ``cached_tokens``
        the prefix reused from the cached log. A warm-up runs no model and uses nothing. A response
        kept open by ``response.append`` adds its earlier engine calls (``progress.spent``: prompt,
        cached and output tokens) to the current one's, whose output starts at ``output_start``."""
        if not turn.request.generate:
            return Usage.of(0, 0, 0)
        engine, spent = progress.engine_usage, progress.spent
        if progress.rendered is not None and route.renderer is not None:
            prompt, cached = Pipeline._prompt_tokens(turn, route, progress.rendered)
        else:
            prompt = (engine.prompt_tokens or 0) if engine else 0
            cached = min((engine.cached_tokens or 0) if engine else 0, prompt)
        output = progress.out.output_tokens - progress.output_start
        if engine is not None and engine.output_tokens is not None:
            output = engine.output_tokens
        return Usage.of(prompt + spent[0], cached + spent[1], output + spent[2], progress.out.reasoning_tokens)

    def _bill(self, turn: Turn, route: Route, usage: Usage, status: str) -> Awaitable[None] | None:
        """Hand the response's usage record to billing; an awaitable result is awaited before
        the terminal event goes out (journal durability ``machine``). The same usage is what
        the tenant's token quota is charged (:attr:`Turn.billed_tokens`)."""
        turn.billed_tokens += usage.input_tokens + usage.output_tokens
        if self.billing is None:
            return None
        try:
            record = self._record(turn, route, turn.response_id, status, usage)
            if self.journal is not None:
                return self.journal.end(record)
            self.billing.submit(record)
        except Exception:  # billing must never break a turn; the biller keeps what it can
            logger.exception("could not submit the usage record of %s", turn.response_id)
        return None

    def _record(self, turn: Turn, route: Route, response_id: str, status: str, usage: Usage) -> UsageRecord:
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

    def _observe(self, turn: Turn, rendered: RenderedPrompt | None, status: str, clock: _EngineClock) -> None:
        m = self.metrics
        labels = {"transport": turn.transport}
        m.inc(f"responses_{status}_total", labels)
        if not turn.request.generate:
            m.inc("warmups_total", labels)
        if rendered is not None:
            m.inc("cached_tokens_total", labels, rendered.cached_tokens)
            m.inc("render_incremental_total" if rendered.incremental else "render_full_total", labels)
            m.observe("rendered_tokens", rendered.log.num_tokens - rendered.cached_tokens, labels)
        for stage, seconds in turn.timings.items():
            m.observe("stage_seconds", seconds, {**labels, "stage": stage})
        m.observe("turn_overhead_seconds", clock.overhead(turn), labels)

    @staticmethod
    def _describe(
        span: TurnSpan, turn: Turn, rendered: RenderedPrompt | None, usage: Usage, engine_cached: int | None
    ) -> None:
        """The turn span's attributes known only at its end: tokens and how they were rendered."""
        if rendered is not None:
            span.set("responses_cache.render.incremental", rendered.incremental)
            span.set("responses_cache.tokens.rendered", rendered.log.num_tokens - rendered.cached_tokens)
            span.set("responses_cache.tokens.reused", rendered.cached_tokens)
        if engine_cached is not None:
            span.set("responses_cache.tokens.engine_cached", engine_cached)
        span.set("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set("gen_ai.usage.output_tokens", usage.output_tokens)

    @staticmethod
    def _log_turn(
        turn: Turn,
        status: str,
        rendered: RenderedPrompt | None,
        usage: Usage | None,
        *,
        clock: _EngineClock | None = None,
        engine_cached: int | None = None,
        error: BaseException | None = None,
    ) -> None:
        """One ``responses_cache.turns`` record per turn (INFO; WARNING when it failed), its
        fields in ``record.turn`` for :class:`~responses_cache.logs.JsonFormatter`."""
        failed = error is not None or status in ("failed", "error")
        level = logging.WARNING if failed else logging.INFO
        if not turn_logger.isEnabledFor(level):
            return
        fields: dict[str, Any] = {
            "response_id": turn.response_id,
            "trace_id": turn.span.trace_id or trace_id_of(turn.trace),
            "tenant": turn.tenant,
            "model": turn.request.model,
            "transport": turn.transport,
            "status": status,
            "parent_tier": turn.tier,
            "duration_ms": round((time.perf_counter() - turn.started) * 1000, 3),
        }
        if clock is not None and clock.first is not None:
            fields["ttft_ms"] = round((clock.first - turn.started) * 1000, 3)
            fields["overhead_ms"] = round(clock.overhead(turn) * 1000, 3)
        if rendered is not None:
            fields["rendered_tokens"] = rendered.log.num_tokens - rendered.cached_tokens
            fields["reused_tokens"] = rendered.cached_tokens
        if usage is not None:
            fields["input_tokens"] = usage.input_tokens
            fields["cached_tokens"] = usage.input_tokens_details.cached_tokens
            fields["output_tokens"] = usage.output_tokens
        if engine_cached is not None:
            fields["engine_cached_tokens"] = engine_cached
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"
            code = getattr(error, "code", None)
            if code:
                fields["error_code"] = code
        turn_logger.log(level, "turn %s %s", turn.response_id, status, extra={"turn": fields})


class _EngineClock:
    """When a turn's engine call started, streamed its first event, and ended: time to first
    token, and the turn's overhead (its wall time outside the engine call)."""

    __slots__ = ("_metrics", "_span", "_transport", "_turn_started", "ended", "first", "started")

    def __init__(self) -> None:
        self.started: float | None = None
        self.first: float | None = None
        self.ended: float | None = None
        self._span: StageSpan = NO_STAGE
        self._metrics: Metrics = NullMetrics()
        self._transport = ""
        self._turn_started = 0.0

    def start(self, turn: Turn, first_token: StageSpan, metrics: Metrics) -> None:
        self.started = time.perf_counter()
        self._span, self._metrics, self._transport, self._turn_started = first_token, metrics, turn.transport, turn.started

    def first_event(self) -> None:
        """The engine's first event (the first token, or the end of a response with none)."""
        self.first = now = time.perf_counter()
        self._span.end()
        self._metrics.observe("time_to_first_token_seconds", now - self._turn_started, {"transport": self._transport})

    def stop(self) -> None:
        if self.started is not None and self.ended is None:
            self.ended = time.perf_counter()

    def overhead(self, turn: Turn) -> float:
        """The turn's wall time so far, less the engine call's (with ``response.append``, the
        waits for appended input count as the engine's)."""
        total = time.perf_counter() - turn.started
        if self.started is not None and self.ended is not None:
            total -= self.ended - self.started
        return max(total, 0.0)


@dataclasses.dataclass(frozen=True, slots=True)
class _Admitted:
    """A turn's input as validation and the blocking hooks let it through."""

    items: list[Item]
    #: The calls left open once the new items are in (validation checked their outputs).
    open_calls: dict[str, str]
    hook_state: dict[str, Any]
    #: The input ended with a ``compaction_trigger`` item: compact now.
    triggered: bool
    #: ``context_management``'s token threshold for an automatic compaction (``None``: none).
    threshold: int | None


@dataclasses.dataclass(slots=True, eq=False)
class _Progress:
    """A response from ``response.created`` to its terminal event: its output so far, the context
    and prompt it has grown to (a compaction replaces them; ``response.append`` rounds extend
    them), its engine call, and how it ends."""

    out: OutputBuilder
    rendered: RenderedPrompt | None
    #: The rendered prompt when ``truncation: "auto"`` cut the conversation.
    truncated: RenderedPrompt | None
    context: Conversation
    #: The conversation's new base when this turn replaced what came before (``None``: it did not).
    base: list[Item] | None
    hook_state: dict[str, Any]
    compact_now: bool
    # The engine call (spans end with it; a preflight stream is ``opened`` until it streams).
    generation: GenerationRequest | None = None
    opened: AsyncGenerator[BackendEvent, None] | None = None
    slot: EngineSlot | None = None
    engine: StageSpan = NO_STAGE
    first_token: StageSpan = NO_STAGE
    clock: _EngineClock = dataclasses.field(default_factory=_EngineClock)
    # What the engine calls gave: the late flag, alongside hooks' states, the last call's end.
    late_flag: Flag | None = None
    alongside_state: dict[str, Any] = dataclasses.field(default_factory=dict)
    finish: Finish | None = None
    engine_usage: EngineUsage | None = None
    # Engine calls finished before the current one (prompt, cached, output tokens), where the
    # current one's output starts, the output item it starts at, and the items after the input
    # before it (output and appended tool outputs, in order).
    spent: tuple[int, int, int] = (0, 0, 0)
    output_start: int = 0
    round_start: int = 0
    earlier: list[Item] = dataclasses.field(default_factory=list)
    #: Output items before the engine's (the compaction item of an automatic compaction).
    first_output: int = 0
    # How it ends.
    status: str = "completed"
    failure: BaseException | None = None
    error: ResponseErrorInfo | None = None
    incomplete: IncompleteDetails | None = None

    @property
    def after_input(self) -> list[Item]:
        """After the input: the output, with the tool outputs appended into it where they came."""
        return [*self.earlier, *self.out.output[self.round_start :]]

    def end_engine(self, error: BaseException | None = None) -> None:
        """End the engine stages (idempotent)."""
        self.first_token.end(error)
        self.engine.end(error)
