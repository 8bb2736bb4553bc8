"""Sampled ids: one assistant turn's output kept as the model produced it."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from responses_cache.tokens import BaseRenderer, HarmonyRenderer, TokenLog, get_renderer

from ._helpers import canonical_ids
from ._strategies import examples, items_, texts


@st.composite
def outputs_(draw: st.DrawFn) -> list[Item]:
    """One turn's output: optional reasoning, then calls or an assistant message."""
    out: list[Item] = []
    if draw(st.booleans()):
        out.append(Reasoning(summary=[], content=[ReasoningText(draw(texts))]))
    if draw(st.booleans()):
        for k in range(draw(st.integers(1, 2))):
            out.append(FunctionCall(call_id=f"s{k}", name="tool", arguments=draw(texts)))
    else:
        out.append(Message(role="assistant", content=[OutputText(draw(texts))]))
    return out


@settings(settings.get_profile("tokens"), max_examples=examples(40))
@given(data=st.data())
def test_canonical_sampled_ids_equal_rendering(renderer: BaseRenderer, data: st.DataObject) -> None:
    r = renderer
    prefix = data.draw(items_(max_size=6))
    outputs = data.draw(outputs_())
    log = r.extend(r.begin("sys", EMPTY_TOOLS), prefix)
    expected = r.extend(log, outputs)
    ids = canonical_ids(r, outputs)
    before = r.stats.tokens_encoded, r.stats.items_sampled
    got = r.extend(log, outputs, sampled=ids)
    assert got.tokens() == expected.tokens()
    assert r.stats.tokens_encoded == before[0]  # nothing was tokenized
    assert r.stats.items_sampled == before[1] + len(outputs)
    # a backend that strips the stop token gives the same log
    stripped = r.extend(log, outputs, sampled=ids[:-1])
    assert stripped.tokens() == expected.tokens()
    # and the conversation goes on from the sampled log like from the rendered one
    more: list[Item] = [Message(role="user", content="next")]
    assert r.prompt(r.extend(got, more)) == r.prompt(r.render_full("sys", EMPTY_TOOLS, [*prefix, *outputs, *more]))


def test_return_becomes_end_and_noncanonical_ids_are_kept() -> None:
    r = HarmonyRenderer()
    enc = r.encoding
    log = r.extend(r.begin(None, EMPTY_TOOLS), [Message(role="user", content="add 1 and 2")])
    prompt = r.prompt(log)
    # the model puts the recipient after the channel (harmony renders it in the role header)
    sampled = enc.encode(
        "<|channel|>analysis<|message|>Need add.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>"
        '{"a":1,"b":2}<|call|>',
        allowed_special="all",
    )
    outputs: list[Item] = [
        Reasoning(summary=[], content=[ReasoningText("Need add.")]),
        FunctionCall(call_id="c1", name="add", arguments='{"a":1,"b":2}'),
    ]
    log2 = r.extend(log, outputs, sampled=sampled)
    assert log2.tokens() == prompt + array("I", sampled)  # exactly what the model saw
    assert log2.common_prefix(log) == log.num_tokens
    assert r.render_full(None, EMPTY_TOOLS, [*[Message(role="user", content="add 1 and 2")], *outputs]).tokens() != log2.tokens()
    # the tool output finds the call's name in the log
    log3 = r.extend(log2, [FunctionCallOutput(call_id="c1", output="3")])
    assert r.decode(log3.item_tokens(3)) == "<|start|>functions.add to=assistant<|channel|>commentary<|message|>3<|end|>"
    # final answer ending in <|return|>: stored as <|end|>, as harmony re-renders history
    final = enc.encode("<|channel|>final<|message|>3<|return|>", allowed_special="all")
    log4 = r.extend(log3, [Message(role="assistant", content=[OutputText("3")])], sampled=final)
    assert r.decode(log4.item_tokens(4)) == "<|start|>assistant<|channel|>final<|message|>3<|end|>"
    # and it hides the earlier analysis like the rendered final would (auto_drop_analysis)
    assert log4.item_hidden(1)
    assert r.decode(r.prompt(log4)).count("Need add.") == 0


def test_unsplittable_sampled_ids_are_kept_as_one_block() -> None:
    r = get_renderer("chatml", encoding="cl100k_base")
    log = r.extend(r.begin(None, EMPTY_TOOLS), [Message(role="user", content="hi")])
    # a Qwen-style reply: reasoning and a call in one message
    sampled = r.encode_text("<think>\nhm\n</think>\n<tool_call>\n{}\n</tool_call>")
    outputs: list[Item] = [
        Reasoning(summary=[], content=[ReasoningText("hm")]),
        FunctionCall(call_id="c", name="f", arguments="{}"),
    ]
    unsplit = r.stats.sampled_unsplit
    log2 = r.extend(log, outputs, sampled=sampled)
    assert r.stats.sampled_unsplit == unsplit + 1
    end = r.encoding.encode("<|im_end|>\n", allowed_special="all")
    assert log2.tokens() == r.prompt(log) + array("I", sampled) + array("I", end)
    assert log2.num_items == 3 and len(log2.item_tokens(2)) == 0
    log3 = r.extend(log2, [FunctionCallOutput(call_id="c", output="ok")])  # call still known
    assert log3.num_items == 4


def test_sampled_requires_assistant_output(renderer: BaseRenderer) -> None:
    log = renderer.begin(None, EMPTY_TOOLS)
    with pytest.raises(ValueError, match="not assistant output"):
        renderer.extend(log, [Message(role="user", content="x")], sampled=[1, 2])


def test_sampled_warm_up_is_a_no_op(renderer: BaseRenderer) -> None:
    log: TokenLog = renderer.begin(None, EMPTY_TOOLS)
    assert renderer.extend(log, [], sampled=[]) is log


def test_content_only_ids_are_rejected_by_harmony() -> None:
    """Ids of the text deltas alone (no channel header) would corrupt the context: rendered instead."""
    r = HarmonyRenderer()
    log = r.extend(r.begin(None, EMPTY_TOOLS), [Message(role="user", content="hi")])
    outputs: list[Item] = [Message(role="assistant", content=[OutputText("Hello there!")])]
    rejected = r.stats.sampled_rejected
    got = r.extend(log, outputs, sampled=r.encode_text("Hello there!"))
    assert r.stats.sampled_rejected == rejected + 1
    assert got.tokens() == r.extend(log, outputs).tokens()


def test_an_unsplittable_turn_hides_what_a_full_render_hides() -> None:
    """A turn kept as one block still counts each of its items for harmony's drop-analysis rule:
    an earlier final inside the block is the conversation's first final, so a later turn's
    analysis stays visible, as in a full render. No cut may fall inside the block."""
    r = HarmonyRenderer()
    enc = r.encoding
    head: list[Item] = [Message(role="user", content="go")]
    log = r.extend(r.begin(None, EMPTY_TOOLS), head)
    turn: list[Item] = [
        Message(role="assistant", content=[OutputText("A")]),
        FunctionCall(call_id="c", name="f", arguments="{}"),
    ]
    # three messages for two items: unsplittable
    sampled = enc.encode(
        "<|channel|>final<|message|>A<|end|><|start|>assistant<|channel|>analysis<|message|>hm<|end|>"
        "<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|>{}<|call|>",
        allowed_special="all",
    )
    unsplit = r.stats.sampled_unsplit
    log = r.extend(log, turn, sampled=sampled)
    assert r.stats.sampled_unsplit == unsplit + 1
    assert [log.splits_at(k) for k in range(4)] == [True, True, False, True]
    later: list[Item] = [
        FunctionCallOutput(call_id="c", output="ok"),
        Reasoning(summary=[], content=[ReasoningText("later thoughts")]),
        Message(role="assistant", content=[OutputText("B")]),
    ]
    log = r.extend(log, later)
    full = r.render_full(None, EMPTY_TOOLS, [*head, *turn, *later])
    assert [log.item_hidden(i) for i in range(6)] == [full.item_hidden(i) for i in range(6)]
    assert not log.item_hidden(4) and "later thoughts" in r.decode(r.prompt(log))
    # rewinding to the block's start drops it whole; a continuation from there renders afresh
    assert r.prompt(r.extend(r.rewind(log, 1), turn)) == r.prompt(r.render_full(None, EMPTY_TOOLS, [*head, *turn]))
