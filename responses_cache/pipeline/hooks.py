"""Validation and safety hooks with an incremental contract.

A hook sees only a turn's **new** items plus the state it carried from the parent response, and
returns a :class:`Verdict` with its new state. Hooks with ``phase = "before"`` run (concurrently)
before generation and a flag blocks the turn; hooks with ``phase = "alongside"`` run while the
model generates and a flag stops the running response.

**Hydration.** A parent rebuilt from the durable store (or produced before a hook was installed)
carries no state for the hook. The runner then gives that hook the parent's whole conversation
followed by the new items, so the hook rebuilds its state once and is incremental again from the
next turn on. Hooks that have state in the parent only ever see the new items.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..observability.tracing import NO_TURN, TurnSpan
from ..protocol.errors import ResponsesError
from ..protocol.items import Item

if TYPE_CHECKING:
    from ..conversation import Conversation

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

    @staticmethod
    def _inputs(
        hooks: Iterable[Hook], items: list[Item], states: Mapping[str, Any], history: Conversation | None
    ) -> list[tuple[Hook, Sequence[Item], Any]]:
        """What each hook is called with: new items and carried state, or (hydration: no carried
        state but a history) the whole history plus the new items and a fresh state."""
        full: list[Item] | None = None
        out: list[tuple[Hook, Sequence[Item], Any]] = []
        for hook in hooks:
            if hook.name in states or history is None or len(history) == 0:
                out.append((hook, items, states.get(hook.name)))
                continue
            if full is None:
                full = [*history.items(), *items]
            out.append((hook, full, None))
        return out

    async def run_before(
        self,
        ctx: HookContext,
        items: list[Item],
        states: Mapping[str, Any],
        *,
        history: Conversation | None = None,
        span: TurnSpan = NO_TURN,
    ) -> tuple[list[Item], dict[str, Any]]:
        """Run the blocking hooks; raises :class:`ResponsesError` on a flag. ``history``: the
        parent's conversation, used only for hooks with no carried state (hydration). Each hook
        call is a ``hook <name>`` stage of the turn's ``span``."""
        new_states = dict(states)
        if not self.before:
            return items, new_states
        calls = self._inputs(self.before, items, states, history)
        verdicts = await asyncio.gather(*(_traced(span, h, ctx, seen, state) for h, seen, state in calls))
        rewrote = False
        for (hook, seen, state), verdict in zip(calls, verdicts, strict=True):
            if rewrote and verdict.items is not None:
                # A second rewriting hook (two redactors, say) ran on the original items; run it
                # again on what the earlier ones made of them, so the rewrites compose.
                ((_, seen, state),) = self._inputs([hook], items, states, history)
                verdict = await _traced(span, hook, ctx, seen, state)
            if verdict.flagged:
                raise Flag(hook.name, verdict).error()
            new_states[hook.name] = verdict.state
            if verdict.items is not None:
                replaced = list(verdict.items)
                # A hydrating hook saw (and may have rewritten) the history too: keep only the
                # replacements of the new items, the history is already part of the context.
                items = replaced[len(seen) - len(items) :] if len(seen) != len(items) else replaced
                rewrote = True
        return items, new_states

    async def run_alongside(
        self,
        ctx: HookContext,
        items: list[Item],
        states: Mapping[str, Any],
        *,
        history: Conversation | None = None,
    ) -> tuple[Flag | None, dict[str, Any]]:
        """Run the non-blocking hooks; returns the first flag (if any) and the new states."""
        new_states: dict[str, Any] = {}
        calls = self._inputs(self.alongside, items, states, history)
        verdicts = await asyncio.gather(*(h(ctx, seen, state) for h, seen, state in calls))
        flag: Flag | None = None
        for hook, verdict in zip(self.alongside, verdicts, strict=True):
            new_states[hook.name] = verdict.state
            if verdict.flagged and flag is None:
                flag = Flag(hook.name, verdict)
        return flag, new_states


async def _traced(span: TurnSpan, hook: Hook, ctx: HookContext, items: Sequence[Item], state: Any) -> Verdict:
    """A blocking hook's call as a stage of the turn (flagged or not)."""
    with span.stage(f"hook {hook.name}") as stage:
        verdict = await hook(ctx, items, state)
        if verdict.flagged:
            stage.set("responses_cache.hook.flagged", True)
        return verdict
