"""The harmony renderer equals openai-harmony's ``render_conversation_for_completion``.

openai-harmony (the reference implementation, in Rust) is the oracle; it is loaded offline from
our bundled vocabulary (see ``conftest.harmony_oracle``). The item -> harmony message mapping below
is the documented one (docs/tokenization.md); the tokens are openai-harmony's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from responses_cache.conversation import EMPTY
from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Item,
    Message,
    OutputText,
    Reasoning,
    ReasoningText,
    Refusal,
)
from responses_cache.protocol.request import decode_create
from responses_cache.protocol.response import Response
from responses_cache.protocol.tools import EMPTY_TOOLS, FunctionTool, NamespaceTool, ToolSet
from responses_cache.session.session import PendingTurn, Session
from responses_cache.storage.state import ResponseState
from responses_cache.tokens import HarmonyRenderer
from responses_cache.tokens.log import TokenLog

from ._strategies import examples, instructions, items_, resent, splits, tool_sets

pytestmark = [pytest.mark.slow]

h = pytest.importorskip("openai_harmony")


def _texts(content: str | Sequence[Any]) -> list[Any]:
    if isinstance(content, str):
        return [h.TextContent(text=content)]
    out = []
    for part in content:
        if isinstance(part, (InputText, OutputText)):
            out.append(h.TextContent(text=part.text))
        elif isinstance(part, Refusal):
            out.append(h.TextContent(text=part.refusal))
    return out


def to_harmony(
    r: HarmonyRenderer, instr: str | None, tools: ToolSet, items: Sequence[Item]
) -> list[Any]:
    """The conversation as openai-harmony messages, built with openai-harmony's own types."""
    system = h.SystemContent.new()
    system.model_identity = r.model_identity
    system.reasoning_effort = None if r.reasoning_effort is None else h.ReasoningEffort(r.reasoning_effort.capitalize())
    system.knowledge_cutoff = r.knowledge_cutoff
    system.conversation_start_date = r.conversation_start_date
    messages = [h.Message.from_role_and_content(h.Role.SYSTEM, system)]

    spaces: dict[str, Any] = {}
    for tool in tools.tools:
        fns: list[FunctionTool]
        if isinstance(tool, FunctionTool):
            ns_name, ns_desc, fns = "functions", None, [tool]
        elif isinstance(tool, NamespaceTool):
            ns_name, ns_desc, fns = tool.name, tool.description, list(tool.tools)
        else:
            continue
        ns = spaces.setdefault(ns_name, h.ToolNamespaceConfig(name=ns_name, description=None, tools=[]))
        if ns.description is None:
            ns.description = ns_desc
        ns.tools.extend(
            h.ToolDescription.new(f.name, f.description or "", parameters=f.parameters) for f in fns
        )
    if instr or spaces:
        developer = h.DeveloperContent.new()
        if instr:
            developer = developer.with_instructions(instr)
        for ns in spaces.values():
            developer = developer.with_tools(ns)
        messages.append(h.Message.from_role_and_content(h.Role.DEVELOPER, developer))

    names: dict[str, str] = {}
    for item in items:
        if isinstance(item, Message):
            msg = h.Message.from_role_and_contents(h.Role(item.role), _texts(item.content))
            if item.role == "assistant":
                msg = msg.with_channel("commentary" if item.phase == "commentary" else "final")
        elif isinstance(item, Reasoning):
            parts = item.content or item.summary
            if not parts:
                continue
            msg = h.Message.from_role_and_contents(
                h.Role.ASSISTANT, [h.TextContent(text=p.text) for p in parts]
            ).with_channel("analysis")
        elif isinstance(item, FunctionCall):
            target = f"{item.namespace or 'functions'}.{item.name}"
            names[item.call_id] = target
            msg = (
                h.Message.from_role_and_content(h.Role.ASSISTANT, item.arguments)
                .with_channel("commentary")
                .with_recipient(target)
                .with_content_type("<|constrain|>json")
            )
        else:
            assert isinstance(item, FunctionCallOutput)
            author = h.Author.new(h.Role.TOOL, names[item.call_id])
            msg = h.Message(author=author, content=_texts(item.output)).with_channel("commentary").with_recipient("assistant")
        messages.append(msg)
    return messages


def iter_common(a: Sequence[int], b: Sequence[int]) -> Iterator[int]:
    for x, y in zip(a, b, strict=False):
        if x != y:
            return
        yield x


def oracle_prompt(
    oracle: Any, r: HarmonyRenderer, instr: str | None, tools: ToolSet, items: Sequence[Item]
) -> list[int]:
    conversation = h.Conversation.from_messages(to_harmony(r, instr, tools, items))
    config = h.RenderConversationConfig(auto_drop_analysis=r.auto_drop_analysis)
    return list(oracle.render_conversation_for_completion(conversation, h.Role.ASSISTANT, config=config))


@pytest.fixture(scope="module", params=[True, False], ids=["auto-drop", "keep-analysis"])
def harmony(request: pytest.FixtureRequest) -> HarmonyRenderer:
    return HarmonyRenderer(auto_drop_analysis=request.param)


@settings(settings.get_profile("tokens"), max_examples=examples(120))
@given(data=st.data())
def test_matches_openai_harmony(harmony_oracle: Any, harmony: HarmonyRenderer, data: st.DataObject) -> None:
    r = harmony
    tools = data.draw(tool_sets())
    instr = data.draw(instructions)
    items = data.draw(items_())
    expected = oracle_prompt(harmony_oracle, r, instr, tools, items)
    assert list(r.prompt(r.render_full(instr, tools, items))) == expected
    # and built turn by turn, checking every intermediate prompt against the oracle
    log = r.begin(instr, tools)
    prev = 0
    for cut in [*data.draw(splits(len(items))), len(items)]:
        log = r.extend(log, items[prev:cut])
        prev = cut
        assert list(r.prompt(log)) == oracle_prompt(harmony_oracle, r, instr, tools, items[:cut])


@settings(settings.get_profile("tokens"), max_examples=examples(150))
@given(tools=tool_sets(), instr=instructions)
def test_header_matches_openai_harmony(harmony_oracle: Any, tools: ToolSet, instr: str | None) -> None:
    """Tool schemas of every shape render exactly as openai-harmony's TypeScript-like text."""
    r = HarmonyRenderer()
    expected = oracle_prompt(harmony_oracle, r, instr, tools, [])
    got = list(r.prompt(r.begin(instr, tools)))
    assert got == expected, (r.decode(got), harmony_oracle.decode(expected))


@pytest.mark.parametrize(
    "options",
    [
        {"reasoning_effort": "high", "conversation_start_date": "2026-01-31"},
        {"reasoning_effort": "low", "knowledge_cutoff": None},
        {"model_identity": None, "reasoning_effort": None},
    ],
)
def test_system_options_match_openai_harmony(harmony_oracle: Any, options: dict[str, Any]) -> None:
    r = HarmonyRenderer(**options)
    items: list[Item] = [Message(role="user", content="hi")]
    tools = EMPTY_TOOLS
    assert list(r.prompt(r.render_full("x", tools, items))) == oracle_prompt(harmony_oracle, r, "x", tools, items)


def test_drop_analysis_example(harmony_oracle: Any) -> None:
    """openai-harmony's ``test_dropping_cot_by_default`` shape, and the rule's re-insertion."""
    r = HarmonyRenderer()
    empty = EMPTY_TOOLS
    turn1: list[Item] = [
        Message(role="user", content="What is 2 + 2?"),
        Reasoning(summary=[], content=[ReasoningText("User asks. Simple arithmetic.")]),
        Message(role="assistant", content=[OutputText("2 + 2 equals 4.")]),
    ]
    log = r.extend(r.begin(None, empty), turn1[:1])
    log = r.extend(log, turn1[1:])
    assert log.item_hidden(1)
    log = r.extend(log, [Message(role="user", content="What about 9 / 2?")])
    assert list(r.prompt(log)) == oracle_prompt(harmony_oracle, r, None, empty, [*turn1, Message(role="user", content="What about 9 / 2?")])
    assert "Simple arithmetic" not in r.decode(r.prompt(log))
    # the next turn is a tool call: the last assistant message is no longer final, so harmony
    # shows the first analysis again -- detected and relinked without re-encoding anything.
    before = r.stats.tokens_encoded, r.stats.rewinds
    call = FunctionCall(call_id="c", name="calc", arguments='{"x": "9/2"}')
    log2 = r.extend(log, [Reasoning(summary=[], content=[ReasoningText("use calc")]), call])
    items2 = [*turn1, Message(role="user", content="What about 9 / 2?"), Reasoning(summary=[], content=[ReasoningText("use calc")]), call]
    assert list(r.prompt(log2)) == oracle_prompt(harmony_oracle, r, None, empty, items2)
    assert not log2.item_hidden(1)
    assert r.stats.rewinds == before[1] + 1
    assert r.stats.tokens_encoded - before[0] == len(log2.item_tokens(4)) + len(log2.item_tokens(5))
    # the shared prefix ends inside item 1 (where the re-shown analysis begins)
    shared = log2.common_prefix(log)
    assert log.header_tokens + len(log.item_tokens(0)) <= shared < log.header_tokens + len(log2.item_tokens(0)) + len(log2.item_tokens(1))
    assert shared == sum(1 for _ in iter_common(log.tokens(), log2.tokens()))


# -- resends, forks and hydration: every path the connection cache offers, against the oracle -------


def _cached(r: HarmonyRenderer, instr: str | None, tools: ToolSet, items: Sequence[Item], log: TokenLog) -> Session:
    """A session whose default lane holds ``items`` rendered as ``log`` (as after a turn)."""
    response = Response(id="resp_1", created_at=0, status="completed", model="m", output=[], tools=[], tool_choice="auto", parallel_tool_calls=True)
    state = ResponseState(
        response=response, tenant="t", lane=None, conversation=EMPTY.extend(list(items)), instructions=instr,
        tools=tools, fingerprint=r.fingerprint(instr, tools), token_log=log, route=None,
    )
    session = Session("t")
    session.cache.put(None, state)
    return session


@settings(settings.get_profile("tokens"), max_examples=examples(60))
@given(data=st.data())
def test_resends_forks_and_hydration_match_openai_harmony(harmony_oracle: Any, harmony: HarmonyRenderer, data: st.DataObject) -> None:
    """A full-input resend (with any renderer-visible or invisible variation) matched by the
    session's matcher, two forks from one cached log, and a hydrated continuation (a full render of
    the stored items, then incremental): each prompt equals openai-harmony's for the conversation
    the client holds."""
    r = harmony
    tools = data.draw(tool_sets(with_schemas=False))
    instr = data.draw(instructions)
    items = data.draw(items_(max_size=10))
    log = r.begin(instr, tools)
    prev = 0
    for cut in [*data.draw(splits(len(items))), len(items)]:  # the cached conversation, turn by turn
        log = r.extend(log, items[prev:cut])
        prev = cut
    # a resend: the conversation again (varied) plus new items, without previous_response_id
    sent = [*data.draw(resent(items)), *data.draw(items_(max_size=3))]
    session = _cached(r, instr, tools, items, log)
    pending = PendingTurn(decode_create(msgspec.json.encode({"type": "response.create", "model": "m", "instructions": instr})), None, 1)
    match = session.match_full_input(pending, sent, tools.fingerprint, r)
    if match is None:
        got = r.render_full(instr, tools, sent)
    else:
        parent, reused = match
        assert parent.token_log is not None and parent.conversation.items() == sent[:reused]
        got = r.extend(parent.token_log, sent[reused:])
    assert list(r.prompt(got)) == oracle_prompt(harmony_oracle, r, instr, tools, sent)
    # forks: two continuations of one cached prefix
    at = data.draw(st.integers(0, len(items)))
    base = r.rewind(log, at)
    for _ in range(2):
        more = data.draw(items_(max_size=3))
        assert list(r.prompt(r.extend(base, more))) == oracle_prompt(harmony_oracle, r, instr, tools, [*items[:at], *more])
    # hydration: the stored items rendered in full once, then continued incrementally
    more = data.draw(items_(max_size=3))
    hydrated = r.extend(r.render_full(instr, tools, sent), more)
    assert list(r.prompt(hydrated)) == oracle_prompt(harmony_oracle, r, instr, tools, [*sent, *more])
