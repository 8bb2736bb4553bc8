"""Token-log snapshots: a chain of per-turn deltas, msgpack-encoded and restored in another
renderer instance (another process), rebuilds the log exactly, extends exactly like the original,
and is refused when the fingerprint differs."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from responses_cache.protocol.items import FunctionCallOutput, Item
from responses_cache.protocol.tools import ToolSet
from responses_cache.tokens import BaseRenderer, TokenLog
from responses_cache.tokens.errors import UnknownCallError
from responses_cache.tokens.snapshot import LogDelta, delta, restore

from ._strategies import examples, instructions, items_, splits, tool_sets
from .conftest import make_renderer

_decode = msgspec.msgpack.Decoder(LogDelta).decode


def _chain(r: BaseRenderer, instr: str | None, tools: ToolSet, items: list[Item], cuts: list[int]) -> tuple[list[TokenLog], list[LogDelta]]:
    """A conversation built turn by turn, the delta of each turn through msgpack."""
    bounds = [0, *cuts, len(items)]
    logs: list[TokenLog] = []
    deltas: list[LogDelta] = []
    log = r.begin(instr, tools)
    for k in range(len(bounds) - 1):
        previous = log.num_items
        log = r.extend(log, items[bounds[k] : bounds[k + 1]])
        d = delta(log, previous if k else None)
        deltas.append(_decode(msgspec.msgpack.encode(d)))
        logs.append(log)
    return logs, deltas


@settings(settings.get_profile("tokens"), max_examples=examples(60))
@given(data=st.data(), instr=instructions, tools=tool_sets(), items=items_(max_size=12))
def test_restored_log_equals_the_original(
    renderer: BaseRenderer, data: st.DataObject, instr: str | None, tools: ToolSet, items: list[Item]
) -> None:
    cuts = data.draw(splits(len(items)))
    logs, deltas = _chain(renderer, instr, tools, items, cuts)
    other = make_renderer(_name_of(renderer))  # a fresh instance: another process
    fingerprint = other.fingerprint(instr, tools)
    for k, log in enumerate(logs):
        restored = restore(other, fingerprint, deltas[: k + 1])
        assert restored is not None
        assert restored.tokens() == log.tokens()
        assert restored.num_items == log.num_items
        # It extends exactly as the original would (the template's rules see the same facts).
        # The strategy's items are always renderable: both must extend, and identically.
        more = data.draw(items_(max_size=4), label="more")
        assert other.extend(restored, more).tokens() == renderer.extend(log, more).tokens()
        # An output for an unknown call: both refuse it, with the same error.
        unknown = [*more, FunctionCallOutput(call_id="call_not_in_this_log", output="?")]
        with pytest.raises(UnknownCallError) as refused:
            renderer.extend(log, unknown)
        with pytest.raises(UnknownCallError) as again:
            other.extend(restored, unknown)
        assert refused.value.item_index == again.value.item_index == len(more)
        assert str(again.value) == str(refused.value)



def _name_of(r: BaseRenderer) -> str:
    if r.template == "harmony":
        return "harmony" if getattr(r, "auto_drop_analysis", True) else "harmony-keep-analysis"
    return "chatml-cl100k" if r.name.endswith("cl100k_base") else "chatml-o200k"


def test_a_different_fingerprint_or_a_gap_is_refused() -> None:
    r = make_renderer("harmony")
    tools = ToolSet((), b"")
    from responses_cache.protocol.items import Message

    items: list[Item] = [Message(role="user", content="hi"), Message(role="assistant", content="hello"), Message(role="user", content="more")]
    _, deltas = _chain(r, "be brief", tools, items, [1, 2])
    assert restore(r, r.fingerprint("be brief", tools), deltas) is not None
    assert restore(r, r.fingerprint("other instructions", tools), deltas) is None
    chatml = make_renderer("chatml-o200k")
    assert restore(chatml, chatml.fingerprint("be brief", tools), deltas) is None  # another template
    assert restore(r, r.fingerprint("be brief", tools), [deltas[0], None, deltas[2]]) is None  # a link kept none
    assert restore(r, r.fingerprint("be brief", tools), [deltas[0], deltas[2]]) is None  # a gap
    assert restore(r, r.fingerprint("be brief", tools), deltas[1:]) is None  # no root
