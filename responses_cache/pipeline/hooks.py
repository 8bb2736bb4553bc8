"""Validation and safety hooks with an incremental contract.

A hook sees only a turn's **new** items plus the state it carried from the parent response, and
returns a :class:`Verdict` with its new state. Hooks with ``phase = "before"`` run (concurrently)
before generation and a flag blocks the turn; hooks with ``phase = "alongside"`` run while the
model generates and a flag stops the running response.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..protocol.errors import ResponsesError
from ..protocol.items import Item

Phase = Literal["before", "alongside"]


@dataclass(frozen=True, slots=True)
class HookContext:
    tenant: str
    model: str
    response_id: str
    lane: str | None
    transport: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """``flagged`` blocks (or stops) the turn; ``state`` is carried to the child response;
    ``items``, when set, replaces the new items (e.g. redacted copies)."""

    flagged: bool = False
    state: Any = None
    code: str = "content_filter"
    message: str = "The input was flagged by a safety check."
    items: Sequence[Item] | None = None


class Hook(Protocol):
    name: str
    phase: Phase

    async def __call__(self, ctx: HookContext, new_items: Sequence[Item], state: Any) -> Verdict: ...


@dataclass(frozen=True, slots=True)
class Flag:
    hook: str
    verdict: Verdict

    def error(self) -> ResponsesError:
        return ResponsesError(self.verdict.message, status=400, code=self.verdict.code, param="input")


class HookRunner:
    """Runs a set of hooks; ``before`` hooks concurrently, ``alongside`` hooks as one task."""

    def __init__(self, hooks: Sequence[Hook] = (), *, late_flag: Literal["incomplete", "failed"] = "incomplete") -> None:
        self.before = [h for h in hooks if h.phase == "before"]
        self.alongside = [h for h in hooks if h.phase == "alongside"]
        self.late_flag = late_flag

    async def run_before(
        self, ctx: HookContext, items: list[Item], states: Mapping[str, Any]
    ) -> tuple[list[Item], dict[str, Any]]:
        """Run the blocking hooks; raises :class:`ResponsesError` on a flag."""
        new_states = dict(states)
        if not self.before:
            return items, new_states
        verdicts = await asyncio.gather(*(h(ctx, items, states.get(h.name)) for h in self.before))
        for hook, verdict in zip(self.before, verdicts):
            if verdict.flagged:
                raise Flag(hook.name, verdict).error()
            new_states[hook.name] = verdict.state
            if verdict.items is not None:
                items = list(verdict.items)
        return items, new_states

    async def run_alongside(
        self, ctx: HookContext, items: list[Item], states: Mapping[str, Any]
    ) -> tuple[Flag | None, dict[str, Any]]:
        """Run the non-blocking hooks; returns the first flag (if any) and the new states."""
        new_states: dict[str, Any] = {}
        verdicts = await asyncio.gather(*(h(ctx, items, states.get(h.name)) for h in self.alongside))
        flag: Flag | None = None
        for hook, verdict in zip(self.alongside, verdicts):
            new_states[hook.name] = verdict.state
            if verdict.flagged and flag is None:
                flag = Flag(hook.name, verdict)
        return flag, new_states
