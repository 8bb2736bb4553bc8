"""The output parsers, fed in arbitrary chunks, give the same events as fed whole."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from responses_cache.backends import ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart
from responses_cache.protocol.items import CustomToolCall
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.tokens import get_renderer
from responses_cache.tokens.parsing import ChatMLParser, HarmonyParser, opens_think

HARMONY = (
    "<|channel|>analysis<|message|>Need to list files <|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json<|message|>"
    '{"cmd": "ls -la"}<|call|>'
)
HARMONY_FINAL = "<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>final<|message|>All <b>done</b>.<|return|>"
CHATML = '<think>\nplan it\n</think>\nSure.<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>'


def _summary(events: list[object]) -> list[tuple[str, str]]:
    """Adjacent deltas of one kind merged, so chunking does not matter."""
    out: list[tuple[str, str]] = []
    for e in events:
        if isinstance(e, ToolCallStart):
            out.append(("call", f"{e.namespace}:{e.name}"))
            continue
        kind, text = (
            ("reasoning", e.text) if isinstance(e, ReasoningDelta)
            else ("text", e.text) if isinstance(e, TextDelta)
            else ("args", e.arguments) if isinstance(e, ToolCallDelta)
            else ("?", repr(e))
        )
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def _run(parser_type: Any, chunks: list[str]) -> list[tuple[str, str]]:
    parser = parser_type()
    events: list[object] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return _summary(events)


def test_harmony_tool_call() -> None:
    assert _run(HarmonyParser, [HARMONY]) == [
        ("reasoning", "Need to list files "),
        ("call", "None:exec_command"),
        ("args", '{"cmd": "ls -la"}'),
    ]


def test_harmony_final_and_namespaced_call() -> None:
    assert _run(HarmonyParser, [HARMONY_FINAL]) == [("reasoning", "ok"), ("text", "All <b>done</b>.")]
    namespaced = "<|channel|>commentary to=multi_agent.spawn <|constrain|>json<|message|>{}<|call|>"
    assert _run(HarmonyParser, [namespaced]) == [("call", "multi_agent:spawn"), ("args", "{}")]


def test_chatml_think_text_and_tool_call() -> None:
    assert _run(ChatMLParser, [CHATML]) == [
        ("reasoning", "\nplan it\n"),
        ("text", "\nSure."),
        ("call", "None:exec_command"),
        ("args", '{"cmd": "ls"}'),
    ]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_chunking_gives_the_same_events(data: st.DataObject) -> None:
    for parser_type, text in ((HarmonyParser, HARMONY), (HarmonyParser, HARMONY_FINAL), (ChatMLParser, CHATML)):
        cuts = sorted(data.draw(st.sets(st.integers(1, len(text) - 1), max_size=12)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert _run(parser_type, chunks) == _run(parser_type, [text])


def test_custom_tool_calls_round_trip_through_both_templates() -> None:
    """What a template renders for a custom tool call parses back to that call (plain-text input)."""
    patch = '*** Begin Patch\n+say "hi" {not json}\n*** End Patch'
    call = CustomToolCall(call_id="c", name="apply_patch", input=patch)
    for template in ("harmony", "chatml"):
        renderer = get_renderer(template)
        ids = renderer.extend(renderer.begin(None, EMPTY_TOOLS), [call]).item_tokens(0)
        sampled = renderer.decode(ids[len(renderer.generation_prompt) :])
        parser = renderer.output_parser(frozenset({"apply_patch"}))
        events = [*parser.feed(sampled), *parser.close()]
        assert events[0] == ToolCallStart(name="apply_patch", custom=True), template
        assert "".join(e.arguments for e in events[1:] if isinstance(e, ToolCallDelta)) == patch
        plain = renderer.output_parser()  # not declared custom: an ordinary function call
        assert next(iter([*plain.feed(sampled), *plain.close()])) == ToolCallStart(name="apply_patch")


THINK_OPEN = 'first, plan\n</think>\n\nDone.<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'


def test_chatml_opened_think_in_the_generation_prompt() -> None:
    expected = [("reasoning", "first, plan\n"), ("text", "\n\nDone."), ("call", "None:f"), ("args", "{}")]
    assert _run(lambda: ChatMLParser(in_think=True), [THINK_OPEN]) == expected
    assert opens_think("<|im_start|>assistant\n<think>\n") and not opens_think("<|im_start|>assistant\n")
    assert not opens_think("<think>\nx\n</think>\n")
    assert isinstance(get_renderer("harmony").output_parser(), HarmonyParser)
    assert isinstance(get_renderer("chatml").output_parser(), ChatMLParser)


@settings(max_examples=100, deadline=None)
@given(st.sets(st.integers(1, len(THINK_OPEN) - 1), max_size=12))
def test_opened_think_any_chunking(cuts: set[int]) -> None:
    points = sorted(cuts)
    chunks = [THINK_OPEN[a:b] for a, b in zip([0, *points], [*points, len(THINK_OPEN)], strict=True)]
    assert _run(lambda: ChatMLParser(in_think=True), chunks) == _run(lambda: ChatMLParser(in_think=True), [THINK_OPEN])
