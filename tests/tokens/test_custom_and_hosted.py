"""Custom (freeform) tools in both templates, and hosted-tool items, which neither can render."""

from __future__ import annotations

import msgspec
import pytest

from responses_cache.protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    HostedItem,
    Item,
    Message,
)
from responses_cache.protocol.tools import parse_tools
from responses_cache.tokens import BaseRenderer, RenderError, get_renderer
from responses_cache.tokens.errors import UnrenderableItemError

GRAMMAR = 'start: "*** Begin Patch" /(.|\\n)*/'
TOOLS = parse_tools(
    msgspec.json.encode(
        [
            {"type": "custom", "name": "apply_patch", "description": "Apply a patch.", "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR}},
            {"type": "custom", "name": "note"},
            {"type": "web_search"},
        ]
    )
)
PATCH = "*** Begin Patch\n+hello\n*** End Patch"
ITEMS: list[Item] = [
    Message(role="user", content="patch it"),
    CustomToolCall(call_id="c1", name="apply_patch", input=PATCH),
    CustomToolCallOutput(call_id="c1", output="Done"),
]


def test_parse_custom_tools() -> None:
    apply_patch, note = TOOLS.customs()
    assert apply_patch.format is not None and apply_patch.format.definition == GRAMMAR  # type: ignore[union-attr]
    assert note.format is None and note.description is None
    assert [t.type for t in TOOLS.hosted()] == ["web_search"]
    assert TOOLS.functions() == []


def test_harmony_declares_and_renders_custom_tools() -> None:
    r = get_renderer("harmony")
    text = r.decode(r.render_full(None, TOOLS, ITEMS).tokens())
    assert "// Apply a patch.\n// Input: text matching this lark grammar:\n// " + GRAMMAR + "\ntype apply_patch = (_: string) => any;" in text
    assert "// Input: plain text.\ntype note = (_: string) => any;" in text
    assert "web_search" not in text
    assert "Calls to these tools must go to the commentary channel: 'functions'." in text
    assert f"<|start|>assistant to=functions.apply_patch<|channel|>commentary<|message|>{PATCH}<|call|>" in text
    assert "<|start|>functions.apply_patch to=assistant<|channel|>commentary<|message|>Done<|end|>" in text


def test_chatml_declares_and_renders_custom_tools() -> None:
    r = get_renderer("chatml")
    text = r.decode(r.render_full(None, TOOLS, ITEMS).tokens())
    assert '{"type": "custom", "custom": {"name": "note", "description": "Input: plain text."}}' in text
    call = '<tool_call>\n{"name": "apply_patch", "input": "*** Begin Patch\\n+hello\\n*** End Patch"}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>" in text
    assert "<|im_start|>tool\n<tool_response>\nDone\n</tool_response><|im_end|>" in text


def test_incremental_custom_call_equals_full(renderer: BaseRenderer) -> None:
    full = renderer.render_full("be brief", TOOLS, ITEMS)
    step = renderer.extend(renderer.extend(renderer.begin("be brief", TOOLS), ITEMS[:2]), ITEMS[2:])
    assert list(step.tokens()) == list(full.tokens())


def test_sampled_custom_call_is_kept_as_sampled(renderer: BaseRenderer) -> None:
    """A custom call the engine sampled goes into the log as those ids (not re-rendered)."""
    call = ITEMS[1]
    rendered = renderer.extend(renderer.begin(None, TOOLS), [call]).item_tokens(0)
    gen = renderer.generation_prompt
    sampled = list(rendered[len(gen) :])
    if renderer.template == "chatml":
        sampled = sampled[: -len(renderer.encode_text("\n"))]
    base = renderer.extend(renderer.begin(None, TOOLS), ITEMS[:1])
    before = renderer.stats.items_sampled
    log = renderer.extend(base, [call], sampled=sampled)
    assert renderer.stats.items_sampled == before + 1
    assert list(log.tokens()) == list(renderer.render_full(None, TOOLS, ITEMS[:2]).tokens())


def test_custom_output_needs_its_call(renderer: BaseRenderer) -> None:
    with pytest.raises(RenderError) as caught:
        renderer.render_full(None, TOOLS, [CustomToolCallOutput(call_id="nope", output="x")])
    assert caught.value.param == "call_id"


def test_hosted_items_are_refused_with_their_position(renderer: BaseRenderer) -> None:
    hosted = HostedItem("web_search_call", b'{"type":"web_search_call","id":"ws_1","status":"completed","action":{}}', "ws_1")
    with pytest.raises(UnrenderableItemError) as caught:
        renderer.render_full(None, TOOLS, [ITEMS[0], hosted])
    assert caught.value.item_index == 1 and caught.value.param == "type"
    assert "'web_search_call'" in caught.value.message and renderer.template in caught.value.message
