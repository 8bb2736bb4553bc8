"""The *generate* stage: stream a backend's events out as Responses output items and events.

:class:`OutputBuilder` is the one place that knows the streaming event grammar: which item is
open, when ``output_item.added``/``content_part.added`` go out, and how an item is closed. It
numbers events per response (``sequence_number`` from 0) and stamps the lane's ``stream_id``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

from ..backends.base import ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart
from ..ids import new_id
from ..protocol import events as ev
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
