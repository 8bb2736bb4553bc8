"""The *generate* stage: stream a backend's events out as Responses output items and events.

:class:`OutputBuilder` is the one place that knows the streaming event grammar: which item is
open, when ``output_item.added``/``content_part.added`` go out, and how an item is closed. It
numbers events per response (``sequence_number`` from 0) and stamps the lane's ``stream_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, Literal

from ..backends.base import (
    BackendEvent,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from ..protocol import events as ev
from ..protocol.ids import new_id
from ..protocol.items import (
    CustomToolCall,
    FunctionCall,
    Item,
    Message,
    OutputText,
    Reasoning,
    ReasoningText,
    WireItem,
)
from .closing import close_stream
from .hooks import Flag
from .interrupt import Interrupt

Emit = Callable[[ev.Event], Awaitable[None]]


class OutputBuilder:
    def __init__(
        self, emit: Emit, stream_id: str | None, seal_reasoning: Callable[[Reasoning], Reasoning] | None = None
    ) -> None:
        self._emit = emit
        #: Applied to each reasoning item as it is closed (``encrypted_content``).
        self._seal_reasoning = seal_reasoning
        self._stream_id = stream_id
        self._seq = 0
        self.output: list[WireItem] = []
        self.output_tokens = 0
        self.reasoning_tokens = 0
        self._kind: Literal["message", "function_call", "custom_tool_call", "reasoning"] | None = None
        self._item_id = ""
        self._buffer: list[str] = []
        self._call: ToolCallStart | None = None
        self._call_id = ""

    async def send(self, event: ev.Event) -> None:
        event.sequence_number = self._seq
        event.stream_id = self._stream_id
        self._seq += 1
        await self._emit(event)

    @property
    def open_kind(self) -> str | None:
        """The kind of the item being streamed (``None`` between items)."""
        return self._kind

    @property
    def index(self) -> int:
        return len(self.output)

    async def feed(self, event: TextDelta | ReasoningDelta | ToolCallStart | ToolCallDelta) -> None:
        if isinstance(event, ToolCallStart):
            await self.close()
            await self._open_call(event)
            return
        if isinstance(event, TextDelta):
            if self._kind != "message":
                await self.close()
                await self._open_message()
            self._count(event.token_ids, reasoning=False)
            self._buffer.append(event.text)
            await self.send(
                ev.OutputTextDelta(item_id=self._item_id, output_index=self.index, content_index=0, delta=event.text, logprobs=[])
            )
        elif isinstance(event, ReasoningDelta):
            if self._kind != "reasoning":
                await self.close()
                await self._open_reasoning()
            self._count(event.token_ids, reasoning=True)
            self._buffer.append(event.text)
            await self.send(
                ev.ReasoningTextDelta(item_id=self._item_id, output_index=self.index, content_index=0, delta=event.text)
            )
        else:
            if self._kind not in ("function_call", "custom_tool_call"):
                raise ValueError("backend sent function-call arguments before a ToolCallStart")
            self._count(event.token_ids, reasoning=False)
            self._buffer.append(event.arguments)
            delta: ev.Event
            if self._kind == "custom_tool_call":
                delta = ev.CustomToolCallInputDelta(item_id=self._item_id, output_index=self.index, delta=event.arguments)
            else:
                delta = ev.FunctionCallArgumentsDelta(item_id=self._item_id, output_index=self.index, delta=event.arguments)
            await self.send(delta)

    def _count(self, token_ids: Sequence[int], *, reasoning: bool) -> None:
        n = len(token_ids) or 1  # a delta without ids counts as one token
        self.output_tokens += n
        if reasoning:
            self.reasoning_tokens += n

    async def _open_message(self) -> None:
        self._kind, self._item_id, self._buffer = "message", new_id("msg"), []
        item = Message(role="assistant", content=[], id=self._item_id, status="in_progress")
        await self.send(ev.OutputItemAdded(output_index=self.index, item=item))
        await self.send(
            ev.ContentPartAdded(item_id=self._item_id, output_index=self.index, content_index=0, part=OutputText(text=""))
        )

    async def _open_reasoning(self) -> None:
        self._kind, self._item_id, self._buffer = "reasoning", new_id("rs"), []
        await self.send(ev.OutputItemAdded(output_index=self.index, item=Reasoning(summary=[], id=self._item_id)))

    async def _open_call(self, start: ToolCallStart) -> None:
        self._call, self._call_id, self._buffer = start, start.call_id or new_id("call"), []
        if start.custom:
            self._kind, self._item_id = "custom_tool_call", new_id("ctc")
            custom = CustomToolCall(
                call_id=self._call_id, name=start.name, input="", id=self._item_id, namespace=start.namespace
            )
            await self.send(ev.OutputItemAdded(output_index=self.index, item=custom))
            return
        self._kind, self._item_id = "function_call", new_id("fc")
        item = FunctionCall(
            call_id=self._call_id, name=start.name, arguments="", id=self._item_id, status="in_progress",
            namespace=start.namespace,
        )
        await self.send(ev.OutputItemAdded(output_index=self.index, item=item))

    async def add(self, item: WireItem) -> None:
        """Output a finished item made by the server, not sampled (a compaction item): its
        ``output_item.added`` and ``.done``. Its tokens are not output tokens."""
        await self.close()
        index = self.index
        await self.send(ev.OutputItemAdded(output_index=index, item=item))
        self.output.append(item)
        await self.send(ev.OutputItemDone(output_index=index, item=item))

    async def close(self, status: Literal["completed", "incomplete"] = "completed") -> None:
        """Close the open item (if any) and emit its ``.done`` events."""
        kind, text, index, item_id = self._kind, "".join(self._buffer), self.index, self._item_id
        if kind is None:
            return
        self._kind, self._buffer = None, []
        item: Item
        if kind == "message":
            part = OutputText(text=text)
            await self.send(ev.OutputTextDone(item_id=item_id, output_index=index, content_index=0, text=text, logprobs=[]))
            await self.send(ev.ContentPartDone(item_id=item_id, output_index=index, content_index=0, part=part))
            item = Message(role="assistant", content=[part], id=item_id, status=status)
        elif kind == "reasoning":
            await self.send(ev.ReasoningTextDone(item_id=item_id, output_index=index, content_index=0, text=text))
            item = Reasoning(summary=[], id=item_id, content=[ReasoningText(text=text)], status=status)
            if self._seal_reasoning is not None:
                item = self._seal_reasoning(item)
        elif kind == "custom_tool_call":
            assert self._call is not None
            await self.send(ev.CustomToolCallInputDone(item_id=item_id, output_index=index, input=text))
            item = CustomToolCall(
                call_id=self._call_id, name=self._call.name, input=text, id=item_id, namespace=self._call.namespace
            )
        else:
            assert self._call is not None
            await self.send(
                ev.FunctionCallArgumentsDone(item_id=item_id, output_index=index, name=self._call.name, arguments=text)
            )
            item = FunctionCall(
                call_id=self._call_id, name=self._call.name, arguments=text, id=item_id, status=status,
                namespace=self._call.namespace,
            )
        self.output.append(item)
        await self.send(ev.OutputItemDone(output_index=index, item=item))


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


#: The alongside hooks' verdict on an engine call: a flag (``None``: none) and their states.
Watcher = asyncio.Task[tuple[Flag | None, dict[str, Any]]]


class EngineRound:
    """One engine call streamed into the output: each backend event races the alongside hooks'
    ``watcher`` (so a flag stops a stalled engine too), steering (``interrupt``) stops it at the
    next safe boundary, and ``mark(output_tokens, reasoning_tokens)`` journals progress at each
    output item's end and every ``mark_every`` output tokens. ``on_first`` runs at the first event."""

    def __init__(
        self,
        stream: AsyncGenerator[BackendEvent, None],
        out: OutputBuilder,
        watcher: Watcher | None,
        interrupt: Interrupt | None,
        mark: tuple[Callable[[int, int], None], int] | None,
        on_first: Callable[[], None] | None,
    ) -> None:
        self._stream, self._events, self._out = stream, stream.__aiter__(), out
        self._watcher, self._interrupt, self._mark, self._on_first = watcher, interrupt, mark, on_first
        #: The backend step racing the hooks, while one is in flight: it must end before the
        #: stream is closed (closing a generator that is still running raises RuntimeError).
        self._step: asyncio.Future[BackendEvent] | None = None
        self._marked = (0, 0)
        self.finish: Finish | None = None
        self.states: dict[str, Any] = {}

    async def run(self) -> tuple[Flag | None, dict[str, Any], Finish | None]:
        """Stream to the end (or a flag, or steering); the stream is closed however it ends."""
        try:
            flagged = await self._pump()
            if flagged is not None:
                return flagged, self.states, None
        finally:
            await self._close()
        if self._watcher is not None:
            flag, states = await self._watcher
            return flag, states, self.finish
        return None, self.states, self.finish

    async def _pump(self) -> Flag | None:
        out, interrupt, events = self._out, self._interrupt, self._events
        while True:
            try:
                if self._watcher is None:  # per token: the plain stream, no call or check of ours
                    event = await events.__anext__()
                else:
                    raced = await self._next()
                    if isinstance(raced, Flag):
                        return raced
                    event = raced
            except StopAsyncIteration:
                return None
            if self._on_first is not None:
                self._on_first()
                self._on_first = None
            if isinstance(event, Finish):
                self.finish = event
                return None
            if interrupt is not None and interrupt.requested and steerable_boundary(out, event):
                interrupt.taken = True
                return None  # closing the stream aborts the engine's request
            await out.feed(event)
            if self._mark is not None:
                self._journal()

    async def _next(self) -> BackendEvent | Flag:
        """While hooks still run: the next event, or the hooks' flag when one came first (hooks
        that finish without one leave the stream to go on alone)."""
        watcher = self._watcher
        assert watcher is not None
        self._step = step = asyncio.ensure_future(self._events.__anext__())
        await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if watcher.done():
            flag, self.states = watcher.result()
            self._watcher = None
            if flag is not None:
                return flag
        event = await step
        self._step = None
        return event

    def _journal(self) -> None:
        assert self._mark is not None
        mark, every = self._mark
        out, (items, tokens) = self._out, self._marked
        if len(out.output) != items or out.output_tokens - tokens >= every:
            self._marked = (len(out.output), out.output_tokens)
            mark(out.output_tokens, out.reasoning_tokens)

    async def _close(self) -> None:
        step = self._step
        if step is not None and not step.done():
            step.cancel()  # the cancellation reaches the backend's generator at its await
        if step is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await step
        try:
            await close_stream(self._stream)  # to the end, even if the turn is cancelled again meanwhile
        finally:
            if self._watcher is not None and self.finish is None:
                self._watcher.cancel()
