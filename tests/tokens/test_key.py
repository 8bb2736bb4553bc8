"""``render_key``: the one definition of "renders the same" (used by the full-input matcher).

Soundness: items with equal render keys render to the same tokens, under every renderer and
whatever came before them. And the key sees every field a renderer reads: a field added to an
item type is part of the key unless it is explicitly ignored.
"""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Message,
    OutputText,
    Reasoning,
    ReasoningText,
    SummaryText,
)
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.tokens import BaseRenderer
from responses_cache.tokens.key import IGNORED_FIELDS, render_key, reusable_prefix
from responses_cache.tokens.log import TokenLog

from ._strategies import INVISIBLE, examples, items_, resent


@settings(settings.get_profile("tokens"), max_examples=examples(60))
@given(data=st.data())
def test_equal_render_keys_render_the_same_tokens(renderer: BaseRenderer, data: st.DataObject) -> None:
    r = renderer
    items = data.draw(items_(max_size=8))
    again = data.draw(resent(items))
    same = [render_key(a) == render_key(b) for a, b in zip(items, again, strict=True)]
    log_a = r.render_full("sys", EMPTY_TOOLS, items)
    log_b = r.render_full("sys", EMPTY_TOOLS, again)
    prefix = same.index(False) if False in same else len(items)
    for k in range(prefix + 1):  # every prefix of render-equal items renders the same
        assert r.prompt(r.rewind(log_a, k)) == r.prompt(r.rewind(log_b, k))
    assert reusable_prefix(items, again, log_a)[0] == prefix


@settings(settings.get_profile("tokens"), max_examples=examples(40))
@given(data=st.data())
def test_invisible_variations_keep_the_key(data: st.DataObject) -> None:
    items = data.draw(items_(max_size=8))
    again = data.draw(resent(items, INVISIBLE))
    assert [render_key(i) for i in items] == [render_key(i) for i in again]


def test_what_the_renderer_reads_is_in_the_key() -> None:
    hi = Message(role="user", content="hello world")
    assert render_key(hi) == render_key(Message(role="user", content=[InputText("hello world")], id="m", status="completed"))
    assert render_key(hi) == render_key(Message(role="user", content=[OutputText("hello world", annotations=[1])]))
    different = [
        Message(role="user", content=[InputText("hello wor"), InputText("ld")]),  # part boundaries
        Message(role="user", content="hello world "),  # whitespace
        Message(role="system", content="hello world"),  # role
        Message(role="user", content="hello world", phase="commentary"),  # phase
    ]
    assert all(render_key(hi) != render_key(d) for d in different)
    call = FunctionCall(call_id="c", name="f", arguments='{"a": 1}')
    for changed in (
        FunctionCall(call_id="d", name="f", arguments='{"a": 1}'),
        FunctionCall(call_id="c", name="f", arguments='{"a":1}'),
        FunctionCall(call_id="c", name="f", arguments='{"a": 1}', namespace="mcp"),
    ):
        assert render_key(call) != render_key(changed)
    assert render_key(FunctionCallOutput(call_id="c", output="x")) != render_key(FunctionCallOutput(call_id="d", output="x"))
    thought = Reasoning(summary=[], content=[ReasoningText("t")])
    for encoding in (
        Reasoning(summary=[SummaryText("t")]),
        Reasoning(summary=[], content=[ReasoningText("t")], encrypted_content="gAAAA"),
        Reasoning(summary=[SummaryText("s")], content=[ReasoningText("t")]),
    ):
        assert render_key(thought) != render_key(encoding)


def test_every_field_but_the_ignored_ones_is_keyed() -> None:
    """A new field on an item type is keyed without anyone remembering to (only the known types'
    own ``id`` and ``status`` are left out); a new item type is keyed on every field, ids too."""

    class Reference(msgspec.Struct, tag="item_reference", frozen=True):
        id: str

    class Custom(msgspec.Struct, tag="custom_tool_call", frozen=True):
        call_id: str
        input: str
        id: str | None = None

    assert render_key(Reference(id="msg_1")) != render_key(Reference(id="msg_2"))  # type: ignore[arg-type]
    a, b = Custom(call_id="c", input="x", id="1"), Custom(call_id="c", input="y", id="1")
    assert render_key(a) != render_key(b)  # type: ignore[arg-type]
    assert render_key(a) != render_key(Custom(call_id="c", input="x", id="2"))  # type: ignore[arg-type]
    for cls in (Message, FunctionCall, FunctionCallOutput, Reasoning):
        assert IGNORED_FIELDS[cls] == {"id", "status"}
        assert {"id", "status"} <= set(cls.__struct_fields__)


def test_the_prefix_never_cuts_an_unsplittable_turn(renderer: BaseRenderer) -> None:
    r = renderer
    head = [Message(role="user", content="go")]
    turn = [Reasoning(summary=[], content=[ReasoningText("hm")]), FunctionCall(call_id="c", name="f", arguments="{}")]
    if r.template == "harmony":  # three messages for two items
        text = (
            "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>analysis<|message|>x<|end|>"
            "<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|>{}<|call|>"
        )
    else:  # one message for two items (a Qwen-style reply)
        text = "<think>\nhm\n</think>\n<tool_call>\n{}\n</tool_call>"
    sampled = r.encoding.encode(text, allowed_special="all")
    log: TokenLog = r.extend(r.extend(r.begin(None, EMPTY_TOOLS), head), turn, sampled=sampled)
    assert not log.splits_at(2)
    cached = [*head, *turn]
    changed = [*head, turn[0], FunctionCall(call_id="c", name="f", arguments="{ }")]
    assert reusable_prefix(cached, changed, log) == (1, 1)  # not 2: that would cut the block
    assert reusable_prefix(cached, cached, log) == (3, 3)
