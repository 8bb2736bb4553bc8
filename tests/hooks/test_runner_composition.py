"""Hooks that rewrite the new items compose: each later rewriter sees the earlier ones' output."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from responses_cache.pipeline.hooks import HookContext, HookRunner, Phase, Verdict
from responses_cache.protocol.items import Item, Message, text_of

CTX = HookContext("t", "m", "resp_1", None, "http")


@dataclasses.dataclass
class Replace:
    name: str
    old: str
    new: str
    phase: Phase = "before"
    calls: int = 0

    async def __call__(self, ctx: HookContext, new_items: Sequence[Item], state: Any) -> Verdict:
        self.calls += 1
        out = [
            Message(role=i.role, content=text_of(i.content).replace(self.old, self.new)) if isinstance(i, Message) else i
            for i in new_items
        ]
        return Verdict(state=(state or 0) + 1, items=out)


async def test_two_rewriting_hooks_compose() -> None:
    a, b = Replace("a", "foo", "A"), Replace("b", "bar", "B")
    items, states = await HookRunner([a, b]).run_before(CTX, [Message(role="user", content="foo bar")], {})
    assert [text_of(i.content) for i in items if isinstance(i, Message)] == ["A B"]
    assert states == {"a": 1, "b": 1}


async def test_a_single_rewriter_runs_once() -> None:
    a = Replace("a", "foo", "A")
    items, _ = await HookRunner([a]).run_before(CTX, [Message(role="user", content="foo")], {})
    assert a.calls == 1 and text_of(items[0].content) == "A"  # type: ignore[union-attr]
