"""Per-turn work is O(new items): counted with ``Renderer.stats``, never timed."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
    OutputText,
    Reasoning,
    ReasoningText,
)
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.tokens import BaseRenderer
from responses_cache.tokens import log as log_module

from ._helpers import canonical_ids

LOREM = "The quick brown fox jumps over the lazy dog. " * 20


def agent_history(turns: int) -> list[Item]:
    """A Codex-like loop: a user task, then reasoning + call + output per step (no final yet)."""
    items: list[Item] = [Message(role="user", content="Fix the bug. " + LOREM)]
    for k in range(turns):
        items += [
            Reasoning(summary=[], content=[ReasoningText(f"step {k}: " + LOREM)]),
            FunctionCall(call_id=f"c{k}", name="shell", arguments='{"cmd": "ls -la"}'),
            FunctionCallOutput(call_id=f"c{k}", output=f"file_{k}.py\n" + LOREM),
        ]
    return items


NEW_TURN: list[Item] = [
    Reasoning(summary=[], content=[ReasoningText("now run the tests " + LOREM)]),
    FunctionCall(call_id="new", name="shell", arguments='{"cmd": "pytest"}'),
    FunctionCallOutput(call_id="new", output="3 passed <|end|> " + LOREM),
]


def delta(r: BaseRenderer, fn: Any) -> tuple[Any, dict[str, int]]:
    before = asdict(r.stats)
    result = fn()
    after = asdict(r.stats)
    return result, {k: after[k] - before[k] for k in after}


def test_tokens_encoded_per_turn_are_the_new_items_only(renderer: BaseRenderer) -> None:
    r = renderer
    costs = []
    for turns in (1, 50):
        log = r.render_full("be careful", EMPTY_TOOLS, agent_history(turns))
        child, d = delta(r, lambda log=log: r.extend(log, NEW_TURN))
        new_tokens = sum(len(child.item_tokens(i)) for i in range(log.num_items, child.num_items))
        assert d["tokens_encoded"] == new_tokens == child.num_tokens - log.num_tokens
        assert d["items_rendered"] == len(NEW_TURN)
        assert d["rewinds"] == d["items_relinked"] == 0
        costs.append(d)
    assert costs[0] == costs[1]  # identical work with 7 or 151 items of history


def test_a_whole_agent_loop_encodes_each_item_once(renderer: BaseRenderer) -> None:
    """Turn by turn with sampled outputs: input items are encoded once, outputs never."""
    r = renderer
    log = r.begin("be careful", EMPTY_TOOLS)
    pending: list[Item] = [Message(role="user", content="Fix the bug. " + LOREM)]
    everything: list[Item] = []
    for k in range(20):
        log, d = delta(r, lambda log=log, pending=pending: r.extend(log, pending))
        assert d["items_rendered"] == len(pending)
        assert d["tokens_encoded"] == sum(
            len(log.item_tokens(i)) for i in range(log.num_items - len(pending), log.num_items)
        )
        _, d = delta(r, lambda log=log: r.prompt(log))
        assert d["tokens_encoded"] == 0
        outputs: list[Item] = [
            Reasoning(summary=[], content=[ReasoningText(f"think {k}")]),
            FunctionCall(call_id=f"c{k}", name="shell", arguments="{}"),
        ]
        sampled = canonical_ids(r, outputs)
        log, d = delta(r, lambda log=log, outputs=outputs, sampled=sampled: r.extend(log, outputs, sampled=sampled))
        assert d["tokens_encoded"] == d["items_rendered"] == 0
        everything += [*pending, *outputs]
        pending = [FunctionCallOutput(call_id=f"c{k}", output=f"out {k} " + LOREM)]
    # canonical sampled ids: the loop's log equals a full render of the whole conversation
    assert log.tokens() == r.render_full("be careful", EMPTY_TOOLS, everything).tokens()


def test_common_prefix_of_child_and_parent_compares_no_tokens(
    renderer: BaseRenderer, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = renderer
    parent = r.render_full(None, EMPTY_TOOLS, agent_history(30))
    child = r.extend(parent, NEW_TURN)
    fork = r.extend(parent, [Message(role="user", content="stop")])

    def forbidden(*_: object) -> int:
        raise AssertionError("token comparison was not needed")

    monkeypatch.setattr(log_module, "_matching", forbidden)
    assert child.common_prefix(parent) == parent.common_prefix(child) == parent.num_tokens
    monkeypatch.undo()
    # two children of one parent compare only their own segments
    assert child.common_prefix(fork) >= parent.num_tokens


def test_rewind_is_cheap_and_exact(renderer: BaseRenderer) -> None:
    r = renderer
    items = agent_history(10)
    log = r.render_full(None, EMPTY_TOOLS, items)
    _, d = delta(r, lambda: r.rewind(log, len(items) - 3))
    assert d["tokens_encoded"] == 0
    assert r.rewind(log, len(items) - 3).tokens() == r.render_full(None, EMPTY_TOOLS, items[:-3]).tokens()
    assert r.rewind(log, 0).num_tokens == r.begin(None, EMPTY_TOOLS).num_tokens
    with pytest.raises(IndexError):
        r.rewind(log, len(items) + 1)


def test_harmony_rewrite_relinks_without_encoding() -> None:
    from responses_cache.tokens import HarmonyRenderer

    r = HarmonyRenderer()
    history = agent_history(40)
    log = r.render_full(None, EMPTY_TOOLS, history)
    final: list[Item] = [Message(role="assistant", content=[OutputText("Done.")])]
    child, d = delta(r, lambda: r.extend(log, final))
    # the final answer hides all 40 earlier analysis messages: one relink, 1 item encoded
    assert d["rewinds"] == 1 and d["items_rendered"] == 1
    assert d["tokens_encoded"] == len(child.item_tokens(len(history)))
    assert child.tokens() == r.render_full(None, EMPTY_TOOLS, history + final).tokens()
    assert sum(child.item_hidden(i) for i in range(child.num_items)) == 40
