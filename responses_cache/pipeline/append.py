"""The long-running response (``response.append``, an opt-in extension): one response that stays
open across client-owned tool calls.

When a response opted in with ``"append": true`` ends a generation with function calls, the
pipeline does not end it: it sends ``response.awaiting_input`` with the pending call ids and waits
on this channel. The WebSocket session (sans-I/O) validates the client's ``response.append``
against :attr:`AppendChannel.pending` and :meth:`delivers <AppendChannel.deliver>` the outputs; the
pipeline then appends them (and the sampled output before them) to the response's token log and
generates again, inside the same response. Delivering is a flag and a list, set on one side and
awaited on the other: nothing here schedules work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ..backends.base import BackendError, Finish
from ..backends.routing import Route
from ..protocol import events as ev
from ..protocol.errors import ResponsesError, invalid_request
from ..protocol.items import CustomToolCall, FunctionCall, Item, WireItem
from .generate import OutputBuilder
from .hooks import Flag
from .interrupt import Interrupt
from .render import RenderedPrompt, extend_with_output


class AppendChannel:
    def __init__(self) -> None:
        #: The call ids the response waits for (empty while it generates).
        self.pending: tuple[str, ...] = ()
        #: Appends delivered into this response so far.
        self.appends = 0
        self._items: list[Item] = []
        self._ready = asyncio.Event()

    @property
    def awaiting(self) -> bool:
        return bool(self.pending)

    def deliver(self, items: list[Item]) -> None:
        """The client's outputs for :attr:`pending` (validated by the session)."""
        assert self.pending, "nothing is awaited"
        self._items = items
        self.pending = ()
        self.appends += 1
        self._ready.set()

    async def wait(self, calls: tuple[str, ...]) -> list[Item]:
        """Wait for the outputs of ``calls`` (a cancellation — the client left — ends the wait)."""
        self._ready.clear()
        self.pending = calls
        try:
            await self._ready.wait()
        finally:
            self.pending = ()
        items, self._items = self._items, []
        return items


class AwaitingInput(ev.Event, tag="response.awaiting_input"):
    """The response stays open for the outputs of ``call_ids`` (send them with ``response.append``)."""

    response_id: str
    call_ids: list[str]


def append_not_enabled() -> ResponsesError:
    """A create asked for ``append`` where the extension is not offered."""
    return invalid_request(
        "The 'append' parameter needs the response.append extension, which this server or transport does not "
        "offer (it is off by default and WebSocket only).",
        "append",
        "append_not_enabled",
    )


def may_append(interrupt: Interrupt | None, late_flag: Flag | None, finish: Finish) -> bool:
    """May a response that opted in to ``response.append`` wait for input now (its engine call
    ended normally: not flagged, cut by length, or steered)?"""
    if late_flag is not None or finish.reason in ("length", "content_filter"):
        return False
    return interrupt is None or not interrupt.taken


def calls_since(out: OutputBuilder, start: int) -> tuple[str, ...]:
    """The function calls the output made since ``start`` (none when it called a custom tool,
    whose output cannot be appended: the response then ends as usual)."""
    produced = out.output[start:]
    if any(isinstance(i, CustomToolCall) for i in produced):
        return ()
    return tuple(i.call_id for i in produced if isinstance(i, FunctionCall))


def append_tokens(
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
