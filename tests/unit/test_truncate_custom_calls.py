"""``truncation: "auto"`` keeps custom (freeform) tool calls with their outputs, as it keeps function
calls: Codex's ``apply_patch`` is a custom tool, and a cut that kept a ``custom_tool_call_output``
without its call would hand the renderer an output it cannot place (an unknown-call error for the
turn) instead of cutting at a later point. Checked at every budget, both templates, real
tokenizers, with custom calls alone, in parallel, and mixed with function calls; then over HTTP,
where a user sees it: the turn that must be cut succeeds, and its prompt starts at a call.

Hosted-tool items (``apply_patch_call``, ``shell_call``, …) never reach truncation on a token
route: they are refused before rendering (400 ``unsupported_value``), with ``truncation: "auto"``
as without it (checked last)."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from responses_cache import create_app
from responses_cache.pipeline.truncate import DoesNotFit, truncate
from responses_cache.protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
)
from responses_cache.protocol.tools import ToolSet, parse_tools
from responses_cache.testing import RecordingBackend
from responses_cache.tokens import BaseRenderer, get_renderer

WORDS = "alpha beta gamma delta epsilon zeta eta theta " * 4
PATCH = "*** Begin Patch\n*** Update File: parser.py\n+    return tokens\n*** End Patch"
TOOL_LIST: list[dict[str, Any]] = [
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch."},
    {"type": "function", "name": "run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
]
TOOLS: ToolSet = parse_tools(msgspec.json.encode(TOOL_LIST))


@pytest.fixture(params=["harmony", "chatml"])
def renderer(request: pytest.FixtureRequest) -> BaseRenderer:
    r = get_renderer(request.param)
    assert isinstance(r, BaseRenderer)
    return r


def user(text: str) -> Message:
    return Message(role="user", content=f"{text} {WORDS}")


def custom_only() -> list[Item]:
    return [
        user("first"),
        CustomToolCall(call_id="p1", name="apply_patch", input=PATCH),
        CustomToolCallOutput(call_id="p1", output=f"Done. {WORDS}"),
        Message(role="assistant", content=f"Patched. {WORDS}"),
        user("second"),
        CustomToolCall(call_id="p2", name="apply_patch", input=PATCH),
        CustomToolCallOutput(call_id="p2", output=f"Done again. {WORDS}"),
        user("third"),
    ]


def parallel_mixed() -> list[Item]:
    return [
        Message(role="developer", content="Follow the house style."),
        user("first"),
        # a custom and a function call made together, answered after both
        CustomToolCall(call_id="p1", name="apply_patch", input=PATCH),
        FunctionCall(call_id="f1", name="run", arguments='{"cmd": "pytest"}'),
        CustomToolCallOutput(call_id="p1", output=f"Done. {WORDS}"),
        FunctionCallOutput(call_id="f1", output=f"1 passed {WORDS}"),
        Message(role="assistant", content=f"Done. {WORDS}"),
        # two custom calls in parallel, answered in the other order
        CustomToolCall(call_id="p2", name="apply_patch", input=PATCH),
        CustomToolCall(call_id="p3", name="apply_patch", input=PATCH),
        CustomToolCallOutput(call_id="p3", output=f"Done three. {WORDS}"),
        CustomToolCallOutput(call_id="p2", output=f"Done two. {WORDS}"),
        user("last"),
    ]


def _paired(kept: list[Item]) -> bool:
    """Every output kept has its call kept before it (per kind)."""
    seen: set[tuple[str, str]] = set()
    for item in kept:
        if isinstance(item, (FunctionCall, CustomToolCall)):
            seen.add((type(item).__name__.replace("Call", ""), item.call_id))
        elif (
            isinstance(item, (FunctionCallOutput, CustomToolCallOutput))
            and (type(item).__name__.replace("CallOutput", ""), item.call_id) not in seen
        ):
            return False
    return True


@pytest.mark.parametrize("items", [custom_only(), parallel_mixed()], ids=["custom", "parallel-mixed"])
def test_no_budget_keeps_a_custom_output_without_its_call(renderer: BaseRenderer, items: list[Item]) -> None:
    full = renderer.render_full("Be helpful.", TOOLS, items)
    cuts = 0
    for budget in range(full.num_tokens - 1, 0, -1):
        try:
            cut = truncate(renderer, "Be helpful.", TOOLS, items, full, budget)
        except DoesNotFit:
            break
        cuts += 1
        assert _paired(cut.kept), (budget, cut.kept)
        assert cut.log.num_tokens <= budget
        assert cut.log.tokens() == renderer.render_full("Be helpful.", TOOLS, cut.kept).tokens()
    assert cuts > 20  # the sweep went through many cuts before none fitted


def test_a_cut_skips_from_before_a_custom_call_to_after_its_output(renderer: BaseRenderer) -> None:
    """The budget a cut right after the call would fit: the cut goes past the output instead."""
    items = custom_only()
    full = renderer.render_full("Be helpful.", TOOLS, items)
    ends = full.item_ends()
    after_call = full.header_tokens + full.num_tokens - ends[1]  # measured: the output first is unrenderable
    after_output = renderer.render_full("Be helpful.", TOOLS, items[3:]).num_tokens
    assert after_output < after_call
    for budget in range(after_output, after_call + 1):
        cut = truncate(renderer, "Be helpful.", TOOLS, items, full, budget)
        assert cut.dropped_items >= 3 and _paired(cut.kept), budget


def _app(window: int) -> tuple[Any, RecordingBackend]:
    backend = RecordingBackend()
    return create_app(backend=backend, context_window=window), backend


def _wire(item: Item) -> dict[str, Any]:
    if isinstance(item, Message):
        return {"role": item.role, "content": item.content}
    if isinstance(item, CustomToolCall):
        return {"type": "custom_tool_call", "call_id": item.call_id, "name": item.name, "input": item.input}
    if isinstance(item, CustomToolCallOutput):
        return {"type": "custom_tool_call_output", "call_id": item.call_id, "output": item.output}
    if isinstance(item, FunctionCall):
        return {"type": "function_call", "call_id": item.call_id, "name": item.name, "arguments": item.arguments}
    assert isinstance(item, FunctionCallOutput)
    return {"type": "function_call_output", "call_id": item.call_id, "output": item.output}


async def test_a_turn_cut_among_custom_calls_succeeds_over_http() -> None:
    """At every window where the full conversation does not fit but its last item does, the turn
    is cut and answered (never refused for an output without its call), and the engine's prompt
    holds each custom output's call."""
    renderer = get_renderer("harmony")
    assert isinstance(renderer, BaseRenderer)
    items = parallel_mixed()
    full = renderer.render_full("Be helpful.", TOOLS, items).num_tokens
    body = {"model": "sim-1", "instructions": "Be helpful.", "tools": TOOL_LIST, "truncation": "auto",
            "max_output_tokens": 16, "input": [_wire(i) for i in items]}
    room = len(renderer.generation_prompt) + 16
    answered = 0
    for window in range(full + room - 1, 0, -6):
        app, backend = _app(window)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t/v1") as client:
            answer = await client.post("/responses", json=body)
        if answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded":
            break  # the last item alone no longer fits
        assert answer.status_code == 200, (window, answer.text)
        assert answer.json()["truncation_details"]["dropped_items"] > 0
        assert _paired(list(backend.requests[-1].conversation.items())), window
        answered += 1
    assert answered > 10
