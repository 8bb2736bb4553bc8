"""The ``hf`` renderer's own behaviour: work per turn, the history policy, cuts, errors, loading
model files, and the family output parsers (round trip through each template)."""

from __future__ import annotations

import itertools
import json
import pathlib
import re
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from responses_cache.backends.base import ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart
from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    HostedItem,
    InputImage,
    InputText,
    Item,
    Message,
    OutputText,
    Reasoning,
    ReasoningText,
)
from responses_cache.protocol.tools import EMPTY_TOOLS, parse_tools
from responses_cache.tokens import (
    RenderError,
    UnknownCallError,
    UnsupportedContentError,
    get_renderer,
)
from responses_cache.tokens.errors import UnrenderableItemError
from responses_cache.tokens.hf import HFRenderer, TemplateRenderError
from responses_cache.tokens.hf_files import ModelFilesError, resolve_model_dir

from .hf_assets import FAMILIES, available, build_tokenizer_dir

pytestmark = [pytest.mark.slow]

LOREM = "The quick brown fox jumps over the lazy dog. " * 20
TOOLS = parse_tools(json.dumps([{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]).encode())


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("hf-models")
    return {family: build_tokenizer_dir(family, root / family) for family in FAMILIES if available(family)}


def hf(dirs: dict[str, pathlib.Path], family: str, **options: Any) -> HFRenderer:
    r = get_renderer(f"hf:{dirs[family]}", **options)
    assert isinstance(r, HFRenderer)
    return r


def step(k: int) -> list[Item]:
    return [
        Reasoning(summary=[], content=[ReasoningText(f"step {k}: {LOREM}")]),
        FunctionCall(call_id=f"c{k}", name="shell", arguments='{"cmd": "ls"}'),
        FunctionCallOutput(call_id=f"c{k}", output=f"file_{k}.py\n{LOREM}"),
    ]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tokens_encoded_per_turn_do_not_grow_with_history(dirs: dict[str, pathlib.Path], family: str) -> None:
    """Each turn tokenizes its own text and a few tokens before it, whatever the history's size."""
    if family not in dirs:
        pytest.skip(f"{FAMILIES[family].package} is not installed")
    r = hf(dirs, family)
    log = r.extend(r.begin("be careful", TOOLS), [Message(role="user", content="Fix it. " + LOREM)])
    costs = []
    for k in range(40):
        before = asdict(r.stats)
        child = r.extend(log, step(k))
        spent = asdict(r.stats)["tokens_encoded"] - before["tokens_encoded"]
        new = len(r.prompt(child)) - len(r.prompt(log)) + len(r.generation_prompt)
        costs.append(spent - new)
        log = child
    assert costs[-1] <= costs[1] + 8, costs  # flat: the same overhead at 40 steps as at 2
    if family == "plain":
        # no added token between messages: the last turn is tokenized again with the new one
        assert r.stats.turns_merged > 0
    else:
        # the overhead is the re-encoded tail before the boundary and the generation prompt
        assert max(costs) <= 64 and r.stats.turns_merged == 0, costs


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_tool_loop_runs_the_template_about_once_per_turn(dirs: dict[str, pathlib.Path], family: str) -> None:
    """A tool step reuses the previous turn's certified window (no run over the window alone) and
    gets the generation prompt from the same run: 4 runs per 3 steps (every third step moves the
    window), not the 3 per step of running it without, with, and with the generation prompt --
    and every prompt is still the whole conversation's."""
    if family not in dirs:
        pytest.skip(f"{FAMILIES[family].package} is not installed")
    r = hf(dirs, family)
    reference = hf(dirs, family, window=None)
    items: list[Item] = [Message(role="user", content="Fix it. " + LOREM)]
    log = r.extend(r.begin("be careful", TOOLS), items)
    for k in range(6):  # past the window's size
        log = r.extend(log, step(k))
        items += step(k)
    runs, windowed = r.stats.template_runs, r.stats.window_renders
    for k in range(6, 18):
        log = r.extend(log, step(k))
        items += step(k)
        assert r.prompt(log) == reference.prompt(reference.render_full("be careful", TOOLS, items))
    assert r.stats.window_renders - windowed == 12
    assert r.stats.template_runs - runs <= 16, r.stats


def test_a_tool_step_converts_only_its_own_items_to_messages(dirs: dict[str, pathlib.Path]) -> None:
    """A turn that reuses the window reuses its chat messages: it converts its own items only, and
    the one that moves the window converts that window once -- the same prompts as without."""
    r = hf(dirs, "qwen")
    reference = hf(dirs, "qwen", window=None)
    items: list[Item] = [Message(role="user", content="Fix it. " + LOREM)]
    log = r.extend(r.begin("be careful", TOOLS), items)
    for k in range(6):
        log = r.extend(log, step(k))
        items += step(k)
    converted = []
    for k in range(6, 24):
        before, runs = r.stats.items_converted, r.stats.template_runs
        log = r.extend(log, step(k))
        items += step(k)
        assert r.prompt(log) == reference.prompt(reference.render_full("be careful", TOOLS, items))
        converted.append(r.stats.items_converted - before)
        if r.stats.template_runs - runs == 1:  # the window was reused
            assert converted[-1] == 3
    assert sum(c == 3 for c in converted) >= 12 and max(converted) <= 1 + 2 * (r.window or 0) + 3, converted


def test_a_window_sees_a_system_message_a_template_refuses_later(dirs: dict[str, pathlib.Path]) -> None:
    """A template checking the roles' alternation by position (as Gemma 3's does) takes a system
    message after the first user message, and refuses the assistant message after it: the window
    reaches back to that system message, so the renderer refuses the conversation too (found by
    the oracle over Gemma 3's files: an empty reasoning item after the system message let the
    window start past it, and the prompt went out)."""
    alternating = (
        "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('roles must alternate') }}{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    old = [Message(role="user", content="a"), Message(role="system", content="s"),
           Reasoning(summary=[], content=[ReasoningText("")])]  # no text: no message, a window start
    new = [Reasoning(summary=[], content=[ReasoningText("thinking")])]  # an assistant message
    for window in (1, None):
        r = hf(dirs, "qwen", chat_template=alternating, window=window)
        log = r.extend(r.begin(None, EMPTY_TOOLS), old)
        with pytest.raises(TemplateRenderError, match="roles must alternate"):
            r.extend(log, new)


@pytest.mark.parametrize(
    ("template", "tools", "calls"),
    [
        (None, True, True),  # the family's own (Qwen's): both
        ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", False, False),
        # DeepSeek-V3's way: definitions written, calls only for a message whose content is None
        ("{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}"
         "{% if m.content is none %}{{ m.tool_calls | tojson }}{% endif %}{% endfor %}", True, False),
    ],
)
def test_a_template_blind_to_tools_is_reported_at_load(
    dirs: dict[str, pathlib.Path], caplog: pytest.LogCaptureFixture, template: str | None, tools: bool, calls: bool
) -> None:
    """A template that writes no tool definitions, or no calls in an assistant message (as the
    chat messages carry them: ``content: ""``), leaves the model blind to them: probed at load,
    a warning says so."""
    import logging

    with caplog.at_level(logging.WARNING, logger="responses_cache.tokens"):
        r = hf(dirs, "qwen", chat_template=template) if template else hf(dirs, "qwen")
    assert (r.renders_tools, r.renders_calls) == (tools, calls)
    said = " ".join(record.getMessage() for record in caplog.records)
    assert ("does not write tool definitions" in said) is not tools, said
    assert ("does not write assistant tool calls" in said) is not calls, said


@pytest.mark.parametrize(
    ("source", "one_run"),
    [
        # the generation prompt is the final block: one run
        ("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<gen>{% endif %}", True),
        ("{% for m in messages %}{{ m.content }}{% endfor %}"
         "{% if add_generation_prompt and messages[-1].role == 'user' %}<gen>{% endif %}", True),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", True),  # no generation prompt at all
        # anything else runs twice
        ("{% if add_generation_prompt %}<gen>{% else %}<no>{% endif %}", False),
        ("{% if add_generation_prompt %}<gen>{% endif %}{{ messages[0].content }}", False),
        ("{{ add_generation_prompt }}{% if add_generation_prompt %}<gen>{% endif %}", False),
        ("{% if not add_generation_prompt %}<no>{% endif %}", False),
        ("{% if messages or add_generation_prompt %}<gen>{% endif %}", False),
        ("{% set g = add_generation_prompt %}{{ g }}{% if add_generation_prompt %}<gen>{% endif %}", False),
    ],
)
def test_generation_prompt_comes_from_one_run_only_where_the_template_proves_it(source: str, one_run: bool) -> None:
    from responses_cache.tokens.hf_files import compile_template

    template = compile_template(source)
    assert template.one_run is one_run
    for messages in ([{"role": "user", "content": "hi"}], [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]):
        variables: dict[str, Any] = {"messages": messages, "tools": None, "documents": None}
        assert template.render_pair(variables) == (template.render(False, variables), template.render(True, variables))


def test_every_family_template_runs_once_per_turn() -> None:
    from responses_cache.tokens.hf_files import compile_template

    for family in FAMILIES.values():
        source = (pathlib.Path(__file__).parent / "hf_templates" / family.template).read_text()
        assert compile_template(source).one_run, family.template


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(st.text(alphabet="<|>ab｜", min_size=1, max_size=6), min_size=1, max_size=12),
    text=st.text(alphabet="<|>ab｜x", max_size=40),
)
def test_added_tokens_pattern_matches_the_longest_token_like_an_alternation(words: list[str], text: str) -> None:
    """The trie-shaped pattern finds the same added tokens as an alternation longest first."""
    import re

    from responses_cache.tokens.hf_tiktoken import literals_pattern

    flat = re.compile("|".join(map(re.escape, sorted(set(words), key=len, reverse=True))))
    trie = re.compile(literals_pattern(words))
    assert [m.span() for m in trie.finditer(text)] == [m.span() for m in flat.finditer(text)]
    end_flat, end_trie = re.compile(f"(?:{flat.pattern})$"), re.compile(f"(?:{trie.pattern})$")
    found, expected = end_trie.search(text), end_flat.search(text)
    assert (found and found.span()) == (expected and expected.span())


def test_rewrite_policy_template_retokenizes_only_on_rewrites(dirs: dict[str, pathlib.Path]) -> None:
    r = hf(dirs, "qwen")
    log = r.extend(r.begin(None, TOOLS), [Message(role="user", content="go")])
    for k in range(5):
        log = r.extend(log, step(k))
    assert r.stats.rewinds == 0  # tool steps after the last user message keep their reasoning
    log = r.extend(log, [Message(role="user", content="and now?")])
    assert r.stats.rewinds == 1 and "step 0" not in r.decode(list(r.prompt(log)))


def test_a_rewrite_retokenizes_from_the_rewritten_turn_only(dirs: dict[str, pathlib.Path]) -> None:
    """Each new user message drops the reasoning of the turn before it (Qwen): the log keeps every
    earlier turn's tokens and encodes the text from the rewritten turn on."""
    r = hf(dirs, "qwen", window=None)
    log = r.begin("be brief", EMPTY_TOOLS)
    spent = []
    for k in range(12):
        before = r.stats.tokens_encoded
        log = r.extend(log, [Message(role="user", content=f"question {k}: {LOREM}")])
        spent.append(r.stats.tokens_encoded - before)
        log = r.extend(log, [Reasoning(summary=[], content=[ReasoningText(f"thinking {k}: {LOREM}")]), Message(role="assistant", content=f"answer {k}")])
    assert r.stats.rewinds == 11
    turn = len(r.encode_text(LOREM))
    assert max(spent) < 4 * turn < log.num_tokens // 3, (spent, turn, log.num_tokens)


def test_keep_policy_keeps_sampled_ids(dirs: dict[str, pathlib.Path]) -> None:
    """``history="keep"``: the sampled ids stay in the log, exactly; the next turn appends the
    template's text for the new items after them."""
    keep, follow = hf(dirs, "qwen", history="keep"), hf(dirs, "qwen")
    items: list[Item] = [Message(role="user", content="hi")]
    answer: list[Item] = [Message(role="assistant", content="hello there")]
    text_ids = keep.encode_text("hello there")
    odd = [*keep.encode_text("hel"), *keep.encode_text("lo there")]  # not the canonical split
    assert odd != text_ids and keep.decode(odd) == "hello there"
    sampled = [*odd, keep.end_token(False)]
    results = []
    for r in (keep, follow):
        log = r.extend(r.begin(None, EMPTY_TOOLS), items)
        prompt = list(r.prompt(log))
        log = r.extend(log, answer, sampled=sampled)
        log = r.extend(log, [Message(role="user", content="bye")])
        results.append((prompt, list(r.prompt(log))))
    (p_keep, next_keep), (_, next_follow) = results
    assert next_keep[: len(p_keep) + len(sampled)] == p_keep + sampled
    assert next_follow != next_keep and keep.decode(next_follow) == keep.decode(next_keep)
    assert keep.stats.items_sampled == 1 and follow.stats.items_sampled == 0


def test_rewind_cuts_only_between_turns(dirs: dict[str, pathlib.Path]) -> None:
    r = hf(dirs, "llama3")
    first = r.extend(r.begin(None, TOOLS), [Message(role="user", content="go")])
    log = r.extend(first, step(0))
    assert list(r.prompt(r.rewind(log, 1))) == list(r.prompt(first))
    assert not log.splits_at(2)
    with pytest.raises(ValueError, match="between turns"):
        r.rewind(log, 2)
    with pytest.raises(ValueError, match="other options"):
        hf(dirs, "qwen").rewind(log, 1)


def test_bad_items_are_client_errors(dirs: dict[str, pathlib.Path]) -> None:
    r = hf(dirs, "qwen")
    log = r.extend(r.begin(None, EMPTY_TOOLS), [Message(role="user", content="go")])
    with pytest.raises(UnknownCallError) as unknown:
        r.extend(log, [Message(role="user", content="x"), FunctionCallOutput(call_id="nope", output="o")])
    assert unknown.value.item_index == 1
    with pytest.raises(UnsupportedContentError):
        r.extend(log, [Message(role="user", content=[InputImage(image_url="http://x/y.png")])])
    with pytest.raises(UnrenderableItemError):
        r.extend(log, [HostedItem("web_search_call", b'{"type": "web_search_call"}')])


def test_template_exceptions_are_client_errors(dirs: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    template = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}{% endif %}{{ m.content }}{% endfor %}"
    r = hf(dirs, "plain", chat_template=template)
    with pytest.raises(TemplateRenderError, match="no system role") as caught:
        r.render_full("be brief", EMPTY_TOOLS, [Message(role="user", content="x")])
    assert isinstance(caught.value, RenderError)
    # A Python error inside the template (DeepSeek-V3's concatenates call arguments, a mapping, to
    # text) is the template refusing the conversation too, not a crash.
    concat = "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}{{ '```' + c.function.arguments }}{% endfor %}{% endfor %}"
    r = hf(dirs, "plain", chat_template=concat)
    call = FunctionCall(call_id="c1", name="f", arguments='{"k": 1}')
    with pytest.raises(TemplateRenderError, match="TypeError"):
        r.render_full(None, EMPTY_TOOLS, [Message(role="user", content="x"), call])


def test_model_directory_forms(dirs: dict[str, pathlib.Path], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory, a Hugging Face cache entry, a cached model id; a chat_template.jinja wins over
    tokenizer_config.json's template; a missing model is a clear error."""
    entry = tmp_path / "hub" / "models--acme--tiny"
    snapshot = entry / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (snapshot / name).write_bytes((dirs["qwen"] / name).read_bytes())
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("abc123")
    assert resolve_model_dir(str(entry)) == snapshot
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_model_dir("acme/tiny") == snapshot
    (snapshot / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    r = get_renderer("hf:acme/tiny")
    log = r.render_full(None, EMPTY_TOOLS, [Message(role="user", content="x")])
    assert r.decode(list(r.prompt(log))) == "[x]"
    with pytest.raises(ModelFilesError, match=r"no tokenizer\.json"):
        get_renderer(f"hf:{tmp_path / 'missing'}")


# -- output parsing: what the template renders for a turn parses back into the turn's items ----


def parse(r: HFRenderer, text: str, custom: frozenset[str] = frozenset()) -> list[Any]:
    """Events of ``text`` fed one character at a time (coalesced per kind)."""
    parser = r.output_parser(custom)
    return coalesce([e for ch in text for e in parser.feed(ch)] + list(parser.close()))


def coalesce(events: list[Any]) -> list[Any]:
    out: list[Any] = []
    for e in events:
        if out and type(e) is type(out[-1]) and isinstance(e, (TextDelta, ReasoningDelta, ToolCallDelta)):
            out[-1] = type(e)(out[-1].text + e.text) if not isinstance(e, ToolCallDelta) else ToolCallDelta(out[-1].arguments + e.arguments)
        else:
            out.append(e)
    return out


def sampled_text(r: HFRenderer, before: list[Item], turn: list[Item]) -> str:
    """The text a model would sample for ``turn``: the template's text after the prompt."""
    prompt = r.render_text(None, TOOLS, before, add_generation_prompt=True)
    full = r.render_text(None, TOOLS, [*before, *turn])
    assert full.startswith(prompt)
    return full[len(prompt) :]


@pytest.mark.parametrize("family", ["qwen", "llama3", "deepseek", "mistral"])
def test_parser_reads_back_a_rendered_tool_turn(dirs: dict[str, pathlib.Path], family: str) -> None:
    r = hf(dirs, family)
    before: list[Item] = [Message(role="user", content="list files")]
    turn: list[Item] = [
        Reasoning(summary=[], content=[ReasoningText("use the shell")]),
        FunctionCall(call_id="a", name="shell", arguments='{"cmd": "ls"}'),
        FunctionCall(call_id="b", name="shell", arguments='{"cmd": "pwd"}'),
    ]
    events = parse(r, sampled_text(r, before, turn))
    calls = [(e.name, json.loads(d.arguments)) for e, d in itertools.pairwise(events) if isinstance(e, ToolCallStart)]
    assert calls == [("shell", {"cmd": "ls"}), ("shell", {"cmd": "pwd"})]
    reasoning = [e.text.strip() for e in events if isinstance(e, ReasoningDelta)]
    assert reasoning == (["use the shell"] if family == "qwen" else [])  # only Qwen's template shows it
    assert not [e for e in events if isinstance(e, TextDelta) and e.text.strip()]


@pytest.mark.parametrize("family", ["qwen", "llama3", "deepseek", "mistral", "plain"])
def test_parser_reads_back_a_rendered_answer(dirs: dict[str, pathlib.Path], family: str) -> None:
    r = hf(dirs, family)
    text = sampled_text(r, [Message(role="user", content="hi")], [Message(role="assistant", content="Hello {there}; <b>")])
    assert "".join(e.text for e in parse(r, text) if isinstance(e, TextDelta)).strip() == "Hello {there}; <b>"


def test_parser_custom_tools_and_streamed_reasoning(dirs: dict[str, pathlib.Path]) -> None:
    r = hf(dirs, "qwen")
    text = '<think>\nplan\n</think>\n\nok <tool_call>\n{"name": "apply_patch", "arguments": {"input": "*** Begin"}}\n</tool_call><|im_end|>'
    events = parse(r, text, frozenset({"apply_patch"}))
    assert events[0] == ReasoningDelta("\nplan\n")
    start = next(e for e in events if isinstance(e, ToolCallStart))
    assert start.custom and start.name == "apply_patch"
    assert ToolCallDelta("*** Begin") in events
    # a malformed call is text, not a call
    assert parse(r, "<tool_call>{not json</tool_call>") == [TextDelta("<tool_call>{not json</tool_call>")]


def test_tool_call_prefix_parses_as_a_call(dirs: dict[str, pathlib.Path]) -> None:
    """``tool_choice``: the prefix the engine continues from, plus a continuation, is one call."""
    for family, rest in (
        ("qwen", '{"cmd": "ls"}}\n</tool_call><|im_end|>'),
        ("llama3", '{"cmd": "ls"}}<|eot_id|>'),
        ("deepseek", '{"cmd": "ls"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'),
        ("mistral", '{"cmd": "ls"}, "id": "a"}]</s>'),
    ):
        r = hf(dirs, family)
        events = parse(r, r.tool_call_prefix("shell") + rest)
        assert [type(e) for e in events] == [ToolCallStart, ToolCallDelta], (family, events)
        assert json.loads(events[1].arguments) == {"cmd": "ls"}


def test_ids_of_the_padded_vocabulary_decode(dirs: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    """A model's ``vocab_size`` may exceed its tokenizer's: such ids (a random-weight model samples
    them) decode to a placeholder instead of failing the stream."""
    model = tmp_path / "padded"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_bytes((dirs["llama3"] / name).read_bytes())
    r = get_renderer(f"hf:{model}")
    size = len(hf(dirs, "llama3").encoding.token_byte_values()) + len(r.encoding.special_tokens_set)
    (model / "config.json").write_text(json.dumps({"vocab_size": size + 64}))
    padded = get_renderer(f"hf:{model}", template_kwargs={"date_string": "1 Jan 2026"})
    assert padded.encoding.decode_bytes([size + 63]) == f"<|unused_id_{size + 63}|>".encode()
    assert padded.decode([*padded.encode_text("hi"), size + 10]) == f"hi<|unused_id_{size + 10}|>"


def test_mistral_and_plain_parsers() -> None:
    from responses_cache.tokens.hf_parsing import family_parser

    mistral = family_parser("mistral", frozenset(), in_think=False, specials=frozenset({"</s>", "[TOOL_CALLS]"}))
    text = 'ok[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "ns.g", "arguments": {}}]</s>'
    events = coalesce([e for ch in text for e in mistral.feed(ch)] + list(mistral.close()))
    # Mistral's templates take only nine-letter-and-digit call ids: each call gets a fresh one
    ids = [e.call_id for e in events if isinstance(e, ToolCallStart)]
    assert all(i is not None and re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids) and len(set(ids)) == 2, ids
    assert events == [TextDelta("ok"), ToolCallStart(name="f", call_id=ids[0]), ToolCallDelta('{"a": 1}'),
                      ToolCallStart(name="g", call_id=ids[1], namespace="ns"), ToolCallDelta("{}")]
    plain = family_parser("plain", frozenset(), in_think=True, specials=frozenset({"</s>"}))
    events = list(plain.feed("hm</think>hi</s>")) + list(plain.close())
    assert events == [ReasoningDelta("hm"), TextDelta("hi")]
    with pytest.raises(ValueError, match="unknown output format"):
        family_parser("nope", frozenset(), in_think=False, specials=frozenset())


def test_engine_messages_carry_arguments_as_json_text(dirs: dict[str, pathlib.Path]) -> None:
    """What goes to an engine's /tokenize: the same messages, call arguments as JSON text that
    parses back to the object the template saw."""
    from responses_cache.tokens.hf_messages import engine_messages

    r = hf(dirs, "qwen")
    items: list[Item] = [Message(role="user", content="go"), FunctionCall(call_id="a", name="shell", arguments='{"cmd": "ls é"}')]
    messages = r.chat_messages("sys", items)
    wire = engine_messages(messages)
    assert wire[2]["tool_calls"][0]["function"]["arguments"] == '{"cmd": "ls é"}'
    assert json.loads(wire[2]["tool_calls"][0]["function"]["arguments"]) == messages[2]["tool_calls"][0]["function"]["arguments"]
    assert [m["role"] for m in wire] == ["system", "user", "assistant"] and r.chat_tools(TOOLS) is not None


@pytest.mark.parametrize("family", ["qwen", "llama3", "deepseek", "mistral"])
def test_call_arguments_stream_before_the_call_ends(dirs: dict[str, pathlib.Path], family: str) -> None:
    """The arguments go out as they arrive, not when the call's closing marker does."""
    r = hf(dirs, family)
    text = sampled_text(r, [Message(role="user", content="go")], [FunctionCall(call_id="a", name="shell", arguments='{"cmd": "ls -la /tmp"}')])
    parser = r.output_parser()
    cut = text.index("/tmp") + 2
    early = list(parser.feed(text[:cut]))
    assert isinstance(early[0], ToolCallStart) and early[0].name == "shell"
    assert "".join(e.arguments for e in early[1:]) == '{"cmd": "ls -la /t'
    rest = [e for e in [*parser.feed(text[cut:]), *parser.close()] if not (isinstance(e, TextDelta) and not e.text.strip())]
    assert "".join(e.arguments for e in rest) == 'mp"}' and all(isinstance(e, ToolCallDelta) for e in rest)


@pytest.mark.parametrize("family", ["qwen", "llama3", "deepseek", "mistral"])
def test_tool_definitions_and_call_arguments_are_dumped_to_json_once(dirs: dict[str, pathlib.Path], family: str) -> None:
    """The template's ``tojson`` remembers the text of the objects the renderer freezes (tool
    definitions, parsed call arguments): a tool step dumps only what is new -- not the tools, not
    the arguments of the calls in the window -- and the prompts stay the whole conversation's."""
    r = hf(dirs, family)
    reference = hf(dirs, family, window=None)
    items: list[Item] = [Message(role="user", content="Fix it. " + LOREM)]
    log = r.extend(r.begin("be careful", TOOLS), items)
    for k in range(6):
        log = r.extend(log, step(k))
        items += step(k)
    calls, dumps = r._runner.template.json.calls, r._runner.template.json.dumps
    for k in range(6, 18):  # every call has the same arguments text: parsed and dumped once
        log = r.extend(log, step(k))
        items += step(k)
        assert r.prompt(log) == reference.prompt(reference.render_full("be careful", TOOLS, items))
    dumped, used = r._runner.template.json.dumps - dumps, r._runner.template.json.calls - calls
    assert (used - dumped) / 12 >= 2  # per step at least the tools and the window's arguments
    if family != "mistral":  # whose template dumps a dict it builds for each tool output
        assert dumped == 0


def test_the_sandbox_refuses_to_change_what_tojson_remembers(dirs: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    """Why remembering is exact: a template cannot change a frozen tool or arguments object."""
    for body in ("{% set _ = tools[0].update({'x': 1}) %}", "{% set _ = tools.append(1) %}",
                 "{% for m in messages %}{% for c in m.tool_calls or [] %}{% set _ = c.function.arguments.clear() %}{% endfor %}{% endfor %}"):
        r = hf(dirs, "qwen", chat_template=body + "{{ tools | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}")
        with pytest.raises(TemplateRenderError):
            r.render_full(None, TOOLS, [Message(role="user", content="hi"), *step(0)[1:]])


def test_string_methods_run_as_in_the_stock_sandbox(dirs: dict[str, pathlib.Path]) -> None:
    """The fast path for a string's methods gives jinja's own sandbox's results, and leaves what
    the sandbox guards guarded: ``format`` (its sandboxed formatter refuses attribute access) and
    underscore attributes."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    body = ("{% for m in messages %}{{ m.content.strip('\\n').split('</think>')[-1].lstrip() }}|"
            "{{ m.content.startswith('<t') }}|{{ m.content.upper().replace('A', 'b') }}|"
            "{{ m.content.rsplit(' ', 1) }}|{{ m.content.count('a') }}|{{ '{0}-{1}'.format(m.role, 1) }}{% endfor %}")
    r = hf(dirs, "plain", chat_template=body)
    items: list[Item] = [Message(role="user", content="\n<think>a</think>  A cat sat\n")]
    stock = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(body)
    assert r.render_text(None, EMPTY_TOOLS, items) == stock.render(messages=r.chat_messages(None, items))
    hidden = ("[{{ messages[0].content.__class__ }}][{{ messages[0].content.strip.__self__ }}]"
              "[{{ '{0.__class__}'.format(messages[0].content) }}][{{ '{x.__class__}'.format_map({'x': messages[0].content}) }}]")
    stock = ImmutableSandboxedEnvironment().from_string(hidden)
    assert hf(dirs, "plain", chat_template=hidden).render_text(None, EMPTY_TOOLS, items) == stock.render(
        messages=r.chat_messages(None, items)) == "[][][][]"


def test_every_text_part_of_a_multi_part_item_reaches_the_prompt(dirs: dict[str, pathlib.Path]) -> None:
    """Messages, tool outputs and answers made of several text parts: the template gets all of
    them (a message's and a tool output's parts joined by newlines, an answer's parts joined, as
    :mod:`~responses_cache.tokens.hf_messages` documents), and the prompt holds each part. The
    transformers oracle cannot see this: it renders the messages this mapping makes."""
    r = hf(dirs, "qwen")
    items: list[Item] = [
        Message(role="user", content=[InputText("first question"), InputText("second question")]),
        Message(role="developer", content=[InputText("note one"), InputText("note two")]),
        FunctionCall(call_id="a", name="shell", arguments='{"cmd": "ls"}'),
        FunctionCallOutput(call_id="a", output=[InputText("stdout part"), InputText("stderr part")]),
        Message(role="assistant", content=[OutputText("Here is "), OutputText("the answer.")]),
    ]
    messages = r.chat_messages(None, items)
    assert [m.get("content") for m in messages] == [
        "first question\nsecond question", "note one\nnote two", "", "stdout part\nstderr part", "Here is the answer.",
    ]
    prompt = r.decode(list(r.prompt(r.render_full(None, EMPTY_TOOLS, items))))
    for part in ("first question\nsecond question", "note one\nnote two", "stdout part\nstderr part", "Here is the answer."):
        assert part in prompt


#: A template whose text for a message depends on everything before it (its number): a window
#: of the conversation renders its old messages with other numbers than the log holds.
NUMBERED = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + ' #' ~ loop.index ~ '\\n' }}"
    "{{- message.content if message.content is defined and message.content else '' }}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_the_window_certificate_sends_a_template_that_numbers_messages_to_a_whole_render(
    dirs: dict[str, pathlib.Path],
) -> None:
    """The windowed path is exact only because it is certified: the window's text for the old
    items must be the end of the log's text. A template that numbers messages fails that check
    on every window, so each turn is rendered over the whole conversation and every prompt
    equals the template run over the whole conversation (without the check, the new items would
    carry the window's numbers)."""
    r = hf(dirs, "qwen", window=1, chat_template=NUMBERED)
    whole = hf(dirs, "qwen", window=None, chat_template=NUMBERED)
    items: list[Item] = [Message(role="user", content="go")]
    log = r.extend(r.begin(None, EMPTY_TOOLS), items)
    for k in range(6):
        turn = [*step(k)[1:], Message(role="user", content=f"and {k}?")] if k % 3 == 2 else step(k)[1:]
        log = r.extend(log, turn)
        items += turn
        assert list(r.prompt(log)) == list(whole.prompt(whole.render_full(None, EMPTY_TOOLS, items))), k
    # Every window short of the whole conversation is refused (one reaching back to its start,
    # to the turn before's call and output, numbers as the log does and is certified).
    assert r.stats.window_renders >= 4 and r.stats.window_misses >= r.stats.window_renders - 1 >= 3, r.stats


#: A template that opens its tool-output block at the conversation's first tool output only (the
#: real DeepSeek-V3 template does): a tool output's text depends on whether any came before it,
#: which a window without an earlier tool output cannot see (and its certificate cannot either:
#: the window's old text holds no tool output).
FIRST_OUTPUT = (
    "{%- set ns = namespace(first=true) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|im_start|>' if ns.first else '<|im_end|>' }}{%- set ns.first = false %}"
    "{{- 'out:' + message.content }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_window_reaches_back_to_the_last_item_of_each_kind_the_turn_adds(dirs: dict[str, pathlib.Path]) -> None:
    """After a stretch of plain chat longer than the window, a tool output is rendered with the
    state the conversation's earlier tool output left (the window reaches back to it): every
    prompt equals the template run over the whole conversation. Without the reach, the window saw
    no earlier output and opened the block again."""
    r = hf(dirs, "qwen", window=1, chat_template=FIRST_OUTPUT)
    whole = hf(dirs, "qwen", window=None, chat_template=FIRST_OUTPUT)
    items: list[Item] = [Message(role="user", content="go")]
    log = r.extend(r.begin(None, EMPTY_TOOLS), items)
    turns: list[list[Item]] = [step(0)[1:]]
    turns += [[Message(role="assistant", content=f"answer {k}"), Message(role="user", content=f"more {k}")] for k in range(3)]
    turns += [step(1)[1:], step(2)[1:]]
    for turn in turns:
        log = r.extend(log, turn)
        items += turn
        assert r.decode(list(r.prompt(log))) == whole.decode(list(whole.prompt(whole.render_full(None, EMPTY_TOOLS, items))))
    assert r.stats.window_renders >= 3, r.stats


#: Mistral's templates' shape: the system prompt is written into the user message only when that
#: message is the conversation's last.
SYSTEM_IN_LAST_USER = (
    "{%- set system = messages[0].content if messages[0].role == 'system' else none %}"
    "{%- for message in messages if message.role != 'system' %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|im_start|>user\n' + (system + '\n\n' if system and loop.last else '') + message.content + '<|im_end|>' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def test_a_head_rendered_otherwise_when_followed_keeps_its_windows(dirs: dict[str, pathlib.Path]) -> None:
    """The head's text alone (its user message last, the system prompt in it) is not its text in
    any window (followed by items, without it): the window's head text is then taken from the
    window's own text less the log's text for its items, certified as the start of the log's
    text. Every prompt equals the whole conversation's, and tool steps run the template one and a
    half times each over the window, not three times over the whole conversation."""
    r = hf(dirs, "qwen", window=2, chat_template=SYSTEM_IN_LAST_USER)
    whole = hf(dirs, "qwen", window=None, chat_template=SYSTEM_IN_LAST_USER)
    items: list[Item] = [Message(role="user", content="go")]
    log = r.extend(r.begin("be brief", EMPTY_TOOLS), items)
    for k in range(4):  # past the window's size
        log = r.extend(log, step(k)[1:])
        items += step(k)[1:]
    full, runs = r.stats.full_renders, r.stats.template_runs
    for k in range(4, 16):
        log = r.extend(log, step(k)[1:])
        items += step(k)[1:]
        assert r.decode(list(r.prompt(log))) == whole.decode(list(whole.prompt(whole.render_full("be brief", EMPTY_TOOLS, items))))
    assert r.stats.full_renders == full, r.stats
    assert r.stats.template_runs - runs <= 18, r.stats  # 1.5 per step; 3 without the windows
    # A new user message moves the system prompt into it: the template rewrites, and it is followed.
    items += [Message(role="assistant", content="done"), Message(role="user", content="again")]
    log = r.extend(log, items[-2:])
    assert r.decode(list(r.prompt(log))) == whole.decode(list(whole.prompt(whole.render_full("be brief", EMPTY_TOOLS, items))))


#: User messages and tool outputs say whether the conversation has three calls or more: a
#: window holding fewer renders its head otherwise than the log, and a new output too, while the
#: calls themselves do not show it.
MANY_CALLS = (
    "{%- set many = (messages | selectattr('tool_calls', 'defined') | list | length) >= 3 %}"
    "{%- for m in messages %}"
    "{%- if m.role in ('user', 'tool') %}"
    "{{- '<|im_start|>' + m.role + (' many' if many else ' few') + '\n' + m.content + '<|im_end|>' }}"
    "{%- elif m.tool_calls is defined %}"
    "{{- '<|im_start|>assistant\n' + m.tool_calls | map(attribute='id') | join(',') + '<|im_end|>' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def test_a_window_whose_head_is_not_the_logs_start_is_not_taken(dirs: dict[str, pathlib.Path]) -> None:
    """The head's text as the window renders it must be the start of the log's text: here the
    window (one call, after a system note) renders the user message as of a conversation of few
    calls, the log (four) of many, and the first output, which the window would add, says few too
    (no call shows it, and there is no earlier output the window would reach back to). Taken, the
    prompt would differ from the whole conversation's."""
    r = hf(dirs, "qwen", window=1, chat_template=MANY_CALLS)
    whole = hf(dirs, "qwen", window=None, chat_template=MANY_CALLS)
    items: list[Item] = [Message(role="user", content="go")]
    log = r.extend(r.begin(None, EMPTY_TOOLS), items)
    for k in range(4):
        for turn in ([Message(role="system", content=f"note {k}")], step(k)[:2]):
            log = r.extend(log, turn)
            items += turn
    items.append(step(3)[2])
    log = r.extend(log, items[-1:])
    assert r.decode(list(r.prompt(log))) == whole.decode(list(whole.prompt(whole.render_full(None, EMPTY_TOOLS, items))))


#: Llama 3's original template's shape: no ``add_generation_prompt``, every rendering ends with the
#: assistant header.
ALWAYS_HEADER = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>' }}"
    "{%- endfor %}"
    "{{- '<|im_start|>assistant\\n' }}"
)


def test_a_template_ending_every_conversation_with_constant_text_stays_incremental(
    dirs: dict[str, pathlib.Path],
) -> None:
    """The constant text after the last message counts as the generation prompt: the log holds the
    text before it, so each turn appends (no rewrite, no whole render) and every prompt is the
    template's text. Without that, the constant sat between a conversation's text and the next
    turn's, and every turn was a history rewrite tokenized from the start of the previous one."""
    r = hf(dirs, "qwen", window=1, chat_template=ALWAYS_HEADER)
    whole = hf(dirs, "qwen", window=None, chat_template=ALWAYS_HEADER)
    items: list[Item] = [Message(role="user", content="go")]
    log = r.extend(r.begin("sys", EMPTY_TOOLS), items)
    for k in range(6):
        log = r.extend(log, step(k)[1:])
        items += step(k)[1:]
        prompt = r.decode(list(r.prompt(log)))
        assert prompt == whole.decode(list(whole.prompt(whole.render_full("sys", EMPTY_TOOLS, items))))
        assert prompt == r.render_text("sys", EMPTY_TOOLS, items, add_generation_prompt=True)
        assert prompt.endswith("<|im_end|><|im_start|>assistant\n")
    assert r.stats.rewinds == 0 and r.stats.full_renders <= 2 and r.stats.window_renders >= 4, r.stats


#: Qwen3's shape for answers (written for these tests): an assistant message after the last user
#: message shows its reasoning in a thinking block, and the conversation's last message, if an
#: answer, shows an empty block without reasoning -- gone once any message follows it.
LAST_ANSWER_THINKS = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set thought = message.reasoning_content if message.reasoning_content is defined and message.reasoning_content else '' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if loop.index0 > ns.last_query and (loop.last or thought) %}{{- '<think>\\n' + thought + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message.content if message.content is defined and message.content else '' }}"
    "{%- for call in message.tool_calls if message.tool_calls is defined %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' + call.function.arguments | tojson + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _sampled(r: HFRenderer, k: int) -> tuple[list[Item], list[int]]:
    """Turn ``k``'s answer and the ids a model sampled for it: its text split as no tokenizer
    would (ids that a rendering of the text never gives back), or a call spelled as the template
    writes it; then the end token."""
    if k % 3 == 2:
        call = FunctionCall(call_id=f"c{k}", name="shell", arguments='{"cmd": "ls"}')
        text = '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>'
        return [call], [*r.encode_with_specials(text), r.end_token(True)]
    text = f"hello there, answer {k}"
    odd = [*r.encode_text(text[:3]), *r.encode_text(text[3:])]
    assert odd != r.encode_text(text) and r.decode(odd) == text
    return [Message(role="assistant", content=[OutputText(text=text)])], [*odd, r.end_token(False)]


@pytest.mark.parametrize("window", [None, 1])
def test_keep_keeps_the_sampled_ids_when_the_template_drops_an_empty_thinking_block(
    dirs: dict[str, pathlib.Path], window: int | None
) -> None:
    """``history="keep"`` with a template that writes an empty thinking block in the last answer and
    drops it once a message follows (Qwen3's): the block was never sampled, the ids were. Each
    next prompt holds the previous one and the ids sampled after it, exactly -- what a client
    sending token ids straight to the engine sends, so the engine's prefix cache serves all of it
    -- and spells the template's text for the whole conversation; whether the turn is taken from
    a window or from the whole conversation. Before, the drop counted as a rewrite of the answer,
    whose text was tokenized again: the engine evaluated the answer again every turn."""
    r = hf(dirs, "qwen", history="keep", window=window, chat_template=LAST_ANSWER_THINKS)
    items: list[Item] = [Message(role="user", content="go")]
    log = r.extend(r.begin(None, EMPTY_TOOLS), items)
    for k in range(8):
        prompt = list(r.prompt(log))
        answer, sampled = _sampled(r, k)
        log = r.extend(log, answer, sampled=sampled)
        follow: list[Item] = (
            [FunctionCallOutput(call_id=f"c{k}", output="a.py b.py")] if k % 3 == 2 else [Message(role="user", content=f"and {k}?")]
        )
        log = r.extend(log, follow)
        items += [*answer, *follow]
        following = list(r.prompt(log))
        assert following[: len(prompt) + len(sampled)] == prompt + sampled, k
        assert r.decode(following) == r.render_text(None, EMPTY_TOOLS, items, add_generation_prompt=True), k
    assert r.stats.items_sampled == 8 and r.stats.sampled_kept == 8 and r.stats.rewinds == 8, r.stats


def test_a_rewrite_inside_the_window_runs_the_template_over_the_window_only(dirs: dict[str, pathlib.Path]) -> None:
    """A template that rewrites the text after the last user message when a message follows
    (:data:`LAST_ANSWER_THINKS`: the last answer's empty thinking block goes, and the reasoning once
    a user message comes): the rewrite shows inside the window, which starts at that user message,
    so the turn is tokenized again from the rewritten turn on with the window's text -- the
    template runs over the window, not over the whole conversation every turn -- and every prompt
    is the one a rendering of the whole conversation gives, token for token."""
    r = hf(dirs, "qwen", window=2, chat_template=LAST_ANSWER_THINKS)
    whole = hf(dirs, "qwen", window=None, chat_template=LAST_ANSWER_THINKS)
    items: list[Item] = [Message(role="user", content="go")]
    log = r.extend(r.begin(None, EMPTY_TOOLS), items)
    whole_renders = converted = 0
    for k in range(12):
        if k == 4:  # past the window's size
            whole_renders, converted = r.stats.full_renders, r.stats.items_converted
        thought = [Reasoning(summary=[], content=[ReasoningText(f"thinking {k}")])] if k % 2 else []
        for turn in ([*thought, Message(role="assistant", content=f"answer {k}")], [Message(role="user", content=f"and {k}?")]):
            log = r.extend(log, turn)
            items += turn
            assert list(r.prompt(log)) == list(whole.prompt(whole.render_full(None, EMPTY_TOOLS, items))), k
    assert r.stats.rewinds == 12 and r.stats.full_renders == whole_renders, r.stats
    # Each of the 16 turns since converted a window's items (at most twice the window and its
    # own), not the conversation's (13 items and more).
    assert r.stats.items_converted - converted <= 16 * (2 * 2 + 3), r.stats
