"""Template details: no delimiter injection, errors, fingerprints, the ChatML format."""

from __future__ import annotations

import msgspec
import pytest

from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputFile,
    InputImage,
    InputText,
    Item,
    Message,
    OutputText,
    Reasoning,
    ReasoningText,
    SummaryText,
)
from responses_cache.protocol.tools import EMPTY_TOOLS, parse_tools
from responses_cache.tokens import (
    BaseRenderer,
    ChatMLRenderer,
    HarmonyRenderer,
    Renderer,
    RenderError,
    UnknownCallError,
    UnsupportedContentError,
    get_renderer,
)

from ._strategies import SPECIAL_LOOKALIKES

TOOLS = parse_tools(
    msgspec.json.encode(
        [
            {"type": "function", "name": "shell", "description": "Run a command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
            {"type": "namespace", "name": "mcp", "description": "MCP tools", "tools": [{"type": "function", "name": "fetch"}]},
        ]
    )
)


def test_renderers_satisfy_the_protocol(renderer: BaseRenderer) -> None:
    assert isinstance(renderer, Renderer)
    assert renderer.name in {"harmony/o200k_harmony", "chatml/cl100k_base", "chatml/o200k_base"}


def test_special_lookalikes_are_plain_text(renderer: BaseRenderer) -> None:
    r = renderer
    specials = set(r.encoding._special_tokens.values())
    evil = "".join(SPECIAL_LOOKALIKES)
    items: list[Item] = [
        Message(role="user", content=evil),
        FunctionCall(call_id="c", name="shell", arguments=evil),
        FunctionCallOutput(call_id="c", output=evil),
        Reasoning(summary=[], content=[ReasoningText(evil)]),
        Message(role="assistant", content=[OutputText(evil)]),
    ]
    log = r.render_full(evil, TOOLS, items)
    clean = r.render_full("x", TOOLS, [Message(role="user", content="x"), FunctionCall(call_id="c", name="shell", arguments="x"), FunctionCallOutput(call_id="c", output="x"), Reasoning(summary=[], content=[ReasoningText("x")]), Message(role="assistant", content=[OutputText("x")])])
    # the same number of special tokens as with harmless text: none came from the content
    count = lambda ids: sum(1 for t in ids if t in specials)  # noqa: E731
    assert count(log.tokens()) == count(clean.tokens())
    assert evil in r.decode(log.item_tokens(0))
    assert r.encode_text(evil) == r.encoding.encode_ordinary(evil)
    assert r.count_text(evil) == len(r.encode_text(evil))


def test_media_parts_raise_a_precise_error(renderer: BaseRenderer) -> None:
    items: list[Item] = [
        Message(role="user", content="fine"),
        Message(role="user", content=[InputText("look"), InputImage(image_url="https://x/y.png")]),
    ]
    with pytest.raises(UnsupportedContentError) as info:
        renderer.render_full(None, EMPTY_TOOLS, items)
    err = info.value
    assert isinstance(err, RenderError) and isinstance(err, ValueError)
    assert (err.item_index, err.part_index, err.part_type, err.param) == (1, 1, "input_image", "content[1]")
    log = renderer.begin(None, EMPTY_TOOLS)
    with pytest.raises(UnsupportedContentError) as info:
        renderer.extend(log, [FunctionCall(call_id="c", name="f", arguments=""), FunctionCallOutput(call_id="c", output=[InputFile(file_id="file_1")])])
    assert (info.value.item_index, info.value.param, info.value.part_type) == (1, "output[0]", "input_file")


def test_output_without_a_call_raises(renderer: BaseRenderer) -> None:
    log = renderer.render_full(None, EMPTY_TOOLS, [FunctionCall(call_id="a", name="f", arguments="{}")])
    with pytest.raises(UnknownCallError) as info:
        renderer.extend(log, [Message(role="user", content="x"), FunctionCallOutput(call_id="zzz", output="1")])
    assert (info.value.item_index, info.value.call_id, info.value.param) == (1, "zzz", "call_id")
    # a call rendered in an earlier turn is found in the log
    assert renderer.extend(log, [FunctionCallOutput(call_id="a", output="1")]).num_items == 2


def test_fingerprint(renderer: BaseRenderer) -> None:
    r = renderer
    fp = r.fingerprint("be brief", TOOLS)
    assert fp == r.fingerprint("be brief", TOOLS) == r.begin("be brief", TOOLS).fingerprint
    assert isinstance(fp, bytes) and len(fp) == 16
    assert fp != r.fingerprint("be brief!", TOOLS)
    assert fp != r.fingerprint("be brief", EMPTY_TOOLS)
    assert r.fingerprint(None, TOOLS) == r.fingerprint("", TOOLS)  # both render no instructions
    assert HarmonyRenderer().fingerprint("x", TOOLS) != HarmonyRenderer(reasoning_effort="high").fingerprint("x", TOOLS)
    assert HarmonyRenderer().fingerprint("x", TOOLS) != ChatMLRenderer().fingerprint("x", TOOLS)


def test_logs_do_not_mix_across_configurations() -> None:
    log = HarmonyRenderer().begin(None, EMPTY_TOOLS)
    assert HarmonyRenderer().extend(log, [Message(role="user", content="ok")]).num_items == 1
    with pytest.raises(ValueError, match="cannot extend"):
        HarmonyRenderer(reasoning_effort="low").extend(log, [Message(role="user", content="x")])


def test_harmony_shapes() -> None:
    r = get_renderer("harmony")
    assert r.name == "harmony/o200k_harmony"
    assert r.decode(r.generation_prompt) == "<|start|>assistant"
    assert set(r.stop_tokens) == {200002, 200007, 200012}
    items: list[Item] = [
        Message(role="developer", content="dev note"),
        Message(role="assistant", content="preamble", phase="commentary"),
        FunctionCall(call_id="1", name="fetch", arguments="{}", namespace="mcp"),
        FunctionCallOutput(call_id="1", output=[InputText("a"), InputText("b")]),
        Reasoning(summary=[SummaryText("s1"), SummaryText("s2")]),
        Reasoning(summary=[], encrypted_content="opaque"),
    ]
    log = r.render_full(None, TOOLS, items)
    got = [r.decode(log.item_tokens(i)) for i in range(log.num_items)]
    assert got == [
        "<|start|>developer<|message|>dev note<|end|>",
        "<|start|>assistant<|channel|>commentary<|message|>preamble<|end|>",
        "<|start|>assistant to=mcp.fetch<|channel|>commentary <|constrain|>json<|message|>{}<|call|>",
        "<|start|>mcp.fetch to=assistant<|channel|>commentary<|message|>ab<|end|>",
        "<|start|>assistant<|channel|>analysis<|message|>s1s2<|end|>",
        "",
    ]
    header = r.decode(r.begin("Be terse.", TOOLS).tokens())
    assert "# Instructions\n\nBe terse.\n\n# Tools\n\n## functions\n\nnamespace functions {" in header
    assert "## mcp\n\n// MCP tools\nnamespace mcp {\n\ntype fetch = () => any;\n\n} // namespace mcp" in header
    assert header.index("## functions") < header.index("## mcp")  # namespaces sorted by name
    assert "Calls to these tools must go to the commentary channel: 'functions'." in header


def test_chatml_shapes() -> None:
    r = get_renderer("chatml", encoding="o200k_base")
    assert r.name == "chatml/o200k_base"
    assert r.decode(r.generation_prompt) == "<|im_start|>assistant\n"
    items: list[Item] = [
        Message(role="user", content="hi"),
        Reasoning(summary=[], content=[ReasoningText("hmm")]),
        FunctionCall(call_id="1", name="shell", arguments='{"cmd": "ls"}'),
        FunctionCallOutput(call_id="1", output="a.py"),
        Message(role="assistant", content=[OutputText("done")]),
    ]
    text = r.decode(r.prompt(r.render_full("Be terse.", TOOLS, items)))
    tools_json = (
        '{"type": "function", "function": {"name": "shell", "description": "Run a command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}\n'
        '{"type": "function", "function": {"name": "mcp.fetch"}}'
    )
    assert text == (
        "<|im_start|>system\nBe terse.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + tools_json
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nhmm\n</think><|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n<tool_response>\na.py\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\ndone<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert r.begin(None, EMPTY_TOOLS).num_tokens == 0
    assert set(r.stop_tokens) == {200265, 199999}
    assert get_renderer("chatml").encoding.encode("<|im_start|><|im_end|>", allowed_special="all") == [100264, 100265]


def test_log_accessors(renderer: BaseRenderer) -> None:
    r = renderer
    log = r.render_full("hi", EMPTY_TOOLS, [Message(role="user", content="a"), Message(role="user", content="b")])
    assert len(log) == log.num_tokens
    assert log.header_tokens == r.begin("hi", EMPTY_TOOLS).num_tokens
    assert list(log.tokens()) == [t for seg in log.iter_segments() for t in seg]
    assert log.renderer_name == r.name
    assert "items=2" in repr(log)
    with pytest.raises(IndexError):
        log.item_tokens(2)
    with pytest.raises(IndexError):
        log.item_hidden(-1)
