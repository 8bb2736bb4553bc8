"""Property tests: a log built turn by turn (with warm-ups, forks, rewinds) equals a full render."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from responses_cache.protocol.items import Item
from responses_cache.protocol.tools import ToolSet
from responses_cache.tokens import BaseRenderer, TokenLog

from ._strategies import examples, instructions, items_, splits, tool_sets


def naive_common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def assert_same(r: BaseRenderer, log: TokenLog, ref: TokenLog) -> None:
    tokens = log.tokens()
    assert tokens == ref.tokens()
    assert log.num_tokens == ref.num_tokens == len(tokens)
    assert log.num_items == ref.num_items
    assert r.prompt(log) == r.prompt(ref)
    assert log.common_prefix(ref) == ref.common_prefix(log) == len(tokens)
    assert tokens.typecode == "I"


def full(r: BaseRenderer, instr: str | None, tools: ToolSet, items: Sequence[Item]) -> TokenLog:
    return r.render_full(instr, tools, items)


@settings(settings.get_profile("tokens"), max_examples=examples(60))
@given(data=st.data())
def test_turn_by_turn_equals_full(renderer: BaseRenderer, data: st.DataObject) -> None:
    r = renderer
    tools = data.draw(tool_sets(with_schemas=False, custom=True))
    instr = data.draw(instructions)
    items = data.draw(items_(custom=True))
    log = r.begin(instr, tools)
    assert_same(r, log, full(r, instr, tools, []))
    prev = 0
    for cut in [*data.draw(splits(len(items))), len(items)]:
        parent = log
        log = r.extend(log, items[prev:cut])  # an empty slice is a warm-up turn
        prev = cut
        assert_same(r, log, full(r, instr, tools, items[:cut]))
        # the parent is untouched by its child (persistence) and shares its prefix
        assert parent.common_prefix(log) == naive_common_prefix(parent.tokens(), log.tokens())


@settings(settings.get_profile("tokens"), max_examples=examples(60))
@given(data=st.data())
def test_forks_and_rewinds(renderer: BaseRenderer, data: st.DataObject) -> None:
    r = renderer
    tools = data.draw(tool_sets(with_schemas=False, custom=True))
    instr = data.draw(instructions)
    prefix = data.draw(items_(max_size=8, custom=True))
    cont_a = data.draw(items_(max_size=6, custom=True))
    cont_b = data.draw(items_(max_size=6, custom=True))
    base = r.extend(r.begin(instr, tools), prefix[: len(prefix) // 2])
    base = r.extend(base, prefix[len(prefix) // 2 :])
    base_tokens = base.tokens()
    a = r.extend(base, cont_a)
    b = r.extend(base, cont_b)
    assert_same(r, a, full(r, instr, tools, prefix + cont_a))
    assert_same(r, b, full(r, instr, tools, prefix + cont_b))
    assert base.tokens() == base_tokens  # forks never modify their parent
    assert a.common_prefix(b) == b.common_prefix(a) == naive_common_prefix(a.tokens(), b.tokens())
    assert a.common_prefix(base) == naive_common_prefix(a.tokens(), base_tokens)

    whole = prefix + cont_a
    k = data.draw(st.integers(0, len(whole)))
    back = r.rewind(a, k)
    assert_same(r, back, full(r, instr, tools, whole[:k]))
    again = r.extend(back, whole[k:])
    assert_same(r, again, a)
    assert again.common_prefix(a) == a.num_tokens


@settings(settings.get_profile("tokens"), max_examples=examples(25))
@given(data=st.data())
def test_single_item_turns(renderer: BaseRenderer, data: st.DataObject) -> None:
    """The agent-loop shape: one item per turn, every intermediate prompt checked."""
    r = renderer
    tools = data.draw(tool_sets(with_schemas=False, custom=True))
    items = data.draw(items_(max_size=10, custom=True))
    log = r.begin("be brief", tools)
    for i, item in enumerate(items):
        log = r.extend(log, [item])
        assert r.prompt(log) == r.prompt(full(r, "be brief", tools, items[: i + 1]))
