"""``truncation: "auto"`` (:mod:`responses_cache.pipeline.truncate`): what a cut may drop, and that
the prompt is exactly a full render of what it kept. Both templates, real tokenizers."""

from __future__ import annotations

import pytest

from responses_cache.pipeline.truncate import DoesNotFit, truncate
from responses_cache.protocol.items import FunctionCall, FunctionCallOutput, Item, Message
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.tokens import BaseRenderer, get_renderer

WORDS = "alpha beta gamma delta epsilon zeta eta theta " * 4


@pytest.fixture(params=["harmony", "chatml"])
def renderer(request: pytest.FixtureRequest) -> BaseRenderer:
    r = get_renderer(request.param)
    assert isinstance(r, BaseRenderer)
    return r


def user(text: str) -> Message:
    return Message(role="user", content=f"{text} {WORDS}")


def conversation() -> list[Item]:
    return [
        Message(role="developer", content="Follow the house style."),
        user("first"),
        # two parallel calls, answered after both were made
        FunctionCall(call_id="c1", name="run", arguments='{"cmd": "ls"}'),
        FunctionCall(call_id="c2", name="run", arguments='{"cmd": "pwd"}'),
        FunctionCallOutput(call_id="c1", output=f"a.txt {WORDS}"),
        FunctionCallOutput(call_id="c2", output=f"/work {WORDS}"),
        Message(role="assistant", content=f"Done. {WORDS}"),
        Message(role="system", content="Be brief from now on."),
        user("second"),
        Message(role="assistant", content=f"Sure. {WORDS}"),
        user("third"),
    ]


def _cut(renderer: BaseRenderer, items: list[Item], budget: int):  # type: ignore[no-untyped-def]
    log = renderer.render_full("Be helpful.", EMPTY_TOOLS, items)
    return truncate(renderer, "Be helpful.", EMPTY_TOOLS, items, log, budget)


def test_the_prompt_is_a_full_render_of_the_kept_items(renderer: BaseRenderer) -> None:
    items = conversation()
    full = renderer.render_full("Be helpful.", EMPTY_TOOLS, items)
    cut = _cut(renderer, items, full.num_tokens - 1)
    assert cut.log.num_tokens <= full.num_tokens - 1
    assert cut.log.tokens() == renderer.render_full("Be helpful.", EMPTY_TOOLS, cut.kept).tokens()
    assert cut.dropped_items >= 1 and cut.kept[-1] == items[-1]


def test_a_cut_never_separates_a_call_from_its_output(renderer: BaseRenderer) -> None:
    items = conversation()
    full = renderer.render_full("Be helpful.", EMPTY_TOOLS, items)
    for budget in range(full.num_tokens - 1, 0, -7):
        try:
            cut = _cut(renderer, items, budget)
        except DoesNotFit:
            break
        calls = {i.call_id for i in cut.kept if isinstance(i, FunctionCall)}
        outputs = {i.call_id for i in cut.kept if isinstance(i, FunctionCallOutput)}
        assert outputs <= calls, (budget, cut.kept)
        assert cut.log.num_tokens <= budget


def test_system_and_developer_messages_are_kept_in_order(renderer: BaseRenderer) -> None:
    items = conversation()
    header = renderer.begin("Be helpful.", EMPTY_TOOLS).num_tokens
    tail = renderer.render_full("Be helpful.", EMPTY_TOOLS, [items[1], items[7], items[-1]]).num_tokens
    cut = _cut(renderer, items, tail + 2)  # room for the kept messages and the last item only
    assert [m for m in cut.kept if isinstance(m, Message) and m.role in ("system", "developer")] == [items[0], items[7]]
    assert cut.kept[:2] == [items[0], items[7]]
    assert cut.log.num_tokens > header


def test_a_last_item_too_long_alone_does_not_fit(renderer: BaseRenderer) -> None:
    items = conversation()
    alone = renderer.render_full("Be helpful.", EMPTY_TOOLS, [items[0], items[7], items[-1]]).num_tokens
    with pytest.raises(DoesNotFit) as caught:
        _cut(renderer, items, alone - 1)
    assert caught.value.smallest >= alone


def test_item_ends_measure_each_item(renderer: BaseRenderer) -> None:
    items = conversation()
    log = renderer.render_full(None, EMPTY_TOOLS, items)
    ends = log.item_ends()
    assert len(ends) == len(items) and ends[-1] == log.num_tokens
    sizes = [b - a for a, b in zip([log.header_tokens, *ends], ends, strict=False)]
    assert sizes == [len(log.item_tokens(i)) for i in range(len(items))]
