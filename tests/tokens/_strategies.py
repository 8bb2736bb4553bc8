"""Hypothesis strategies: random Responses conversations, tool sets and JSON schemas."""

from __future__ import annotations

import os
from typing import Any

import msgspec
from hypothesis import strategies as st

from responses_cache.protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Item,
    Message,
    OutputText,
    Reasoning,
    ReasoningText,
    Refusal,
    SummaryText,
    text_of,
)
from responses_cache.protocol.tools import ToolSet, parse_tools

#: Multiply every test's example count (``TOKENS_EXAMPLES_FACTOR=20`` for a soak run).
FACTOR = float(os.environ.get("TOKENS_EXAMPLES_FACTOR", "1"))


def examples(n: int) -> int:
    """The number of hypothesis examples for a test (``n`` scaled by ``FACTOR``)."""
    return max(1, int(n * FACTOR))


SPECIAL_LOOKALIKES = [
    "<|end|>",
    "<|start|>",
    "<|start|>assistant<|channel|>final<|message|>",
    "<|message|>",
    "<|channel|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|im_start|>system\n",
    "<|endofprompt|>",
    "<|reserved_200013|>",
    "<|",
    "|>",
]
WHITESPACE = [" ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "   \n\n\t  ", "\u00a0", "\u3000"]

# Lone surrogates cannot reach openai-harmony (JSON), so the alphabet leaves them out.
_chars = st.characters(blacklist_categories=("Cs",))
_fragment = st.one_of(
    st.text(_chars, max_size=12),
    st.sampled_from(SPECIAL_LOOKALIKES),
    st.sampled_from(WHITESPACE),
    st.sampled_from(["hello", "world", "def f(x):\n    return x", "{\"a\": 1}", "日本語", "😀👍🏽", "é́"]),
)
texts = st.lists(_fragment, max_size=6).map("".join)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)

_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(_chars, max_size=8),
)
json_values = st.recursive(
    _json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(_chars, max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)

_schema_extras: dict[str, st.SearchStrategy[Any]] = {
    "description": texts,
    "default": json_values,
    "nullable": st.booleans(),
    "title": st.text(_chars, max_size=10),
    "examples": st.lists(st.one_of(st.text(_chars, max_size=8), st.integers()), max_size=2),
}


def _leaf() -> st.SearchStrategy[dict[str, Any]]:
    base = st.one_of(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["number", "integer", "boolean", "null", "array", "weird"])},
            optional=_schema_extras,
        ),
        st.fixed_dictionaries(
            {"type": st.just("string")},
            optional={**_schema_extras, "enum": st.lists(st.one_of(texts, st.integers()), max_size=3)},
        ),
        st.fixed_dictionaries(
            {"type": st.lists(st.sampled_from(["string", "integer", "null", "number"]), min_size=1, max_size=3)},
            optional=_schema_extras,
        ),
        st.just({}),
    )
    return base


def _compound(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    props = st.dictionaries(st.text(_chars, min_size=1, max_size=6), inner, max_size=4)

    def obj(p: dict[str, Any], req_mask: list[bool], extras: dict[str, Any]) -> dict[str, Any]:
        required = [k for k, keep in zip(p, req_mask, strict=False) if keep]
        out: dict[str, Any] = {"type": "object", "properties": p, **extras}
        if required:
            out["required"] = required
        return out

    objects = st.builds(
        obj,
        props,
        st.lists(st.booleans(), max_size=4),
        st.fixed_dictionaries({}, optional={"description": texts, "default": json_values}),
    )
    arrays = st.builds(lambda items: {"type": "array", "items": items}, inner)
    one_ofs = st.builds(
        lambda vs, extras: {"oneOf": vs, **extras},
        st.lists(inner, min_size=1, max_size=3),
        st.fixed_dictionaries({}, optional={"description": texts, "default": json_values, "type": st.just("object")}),
    )
    return st.one_of(objects, arrays, one_ofs)


schemas = st.recursive(_leaf(), _compound, max_leaves=8)
parameters = st.one_of(
    st.none(),
    st.builds(
        lambda p: {"type": "object", "properties": p, "required": list(p)[:1]},
        st.dictionaries(names, schemas, max_size=4),
    ),
    schemas,
)


@st.composite
def _function(draw: st.DrawFn, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "name": name}
    desc = draw(st.one_of(st.none(), texts))
    if desc is not None:
        out["description"] = desc
    params = draw(parameters)
    if params is not None:
        out["parameters"] = params
    return out


@st.composite
def tool_sets(draw: st.DrawFn, *, with_schemas: bool = True, custom: bool = False) -> ToolSet:
    """A parsed tool list: top-level functions, namespaces, sometimes a hosted tool (and, with
    ``custom``, sometimes custom tools)."""
    raw: list[dict[str, Any]] = []
    for name in draw(st.lists(names, max_size=3, unique=True)):
        raw.append(draw(_function(name)) if with_schemas else {"type": "function", "name": name})
    for ns in draw(st.lists(st.sampled_from(["mcp", "files", "functions", "zeta"]), max_size=2, unique=True)):
        entry: dict[str, Any] = {
            "type": "namespace",
            "name": ns,
            "tools": [draw(_function(n)) for n in draw(st.lists(names, max_size=2, unique=True))],
        }
        desc = draw(st.one_of(st.none(), texts))
        if desc is not None:
            entry["description"] = desc
        raw.append(entry)
    if draw(st.booleans()):
        raw.append({"type": "web_search"})
    if custom:
        for name in draw(st.lists(st.sampled_from(["apply_patch", "sql"]), max_size=2, unique=True)):
            fmt = draw(st.sampled_from([None, {"type": "text"}, {"type": "grammar", "syntax": "lark", "definition": 'start: "x"'}]))
            raw.append({"type": "custom", "name": name, "description": draw(texts), **({"format": fmt} if fmt else {})})
    return parse_tools(msgspec.json.encode(raw))


def _parts(draw: st.DrawFn, assistant: bool) -> str | list[Any]:
    if draw(st.booleans()):
        return draw(texts)
    kinds = st.sampled_from(["out", "refusal"]) if assistant else st.just("in")
    parts: list[Any] = []
    for kind in draw(st.lists(kinds, max_size=3)):
        t = draw(texts)
        parts.append(OutputText(t) if kind == "out" else Refusal(t) if kind == "refusal" else InputText(t))
    return parts


@st.composite
def items_(draw: st.DrawFn, *, min_size: int = 0, max_size: int = 14, custom: bool = False) -> list[Item]:
    """A conversation: messages of every role, reasoning, calls and outputs for earlier calls
    (with ``custom``, custom tool calls and their outputs too)."""
    n = draw(st.integers(min_value=min_size, max_value=max_size))
    out: list[Item] = []
    calls: list[str] = []
    for k in range(n):
        kinds = ["user", "assistant", "reasoning", "call", "system", "developer"]
        if custom:
            kinds.append("custom")
        if calls:
            kinds += ["output", "output"]
        if custom and calls:
            kinds.append("custom_output")
        kind = draw(st.sampled_from(kinds))
        if kind in ("user", "system", "developer"):
            out.append(Message(role=kind, content=_parts(draw, assistant=False)))  # type: ignore[arg-type]
        elif kind == "assistant":
            phase = draw(st.sampled_from([None, None, "final_answer", "commentary"]))
            out.append(Message(role="assistant", content=_parts(draw, assistant=True), phase=phase))
        elif kind == "reasoning":
            shape = draw(st.sampled_from(["content", "summary", "both", "empty"]))
            content = [ReasoningText(draw(texts)) for _ in range(draw(st.integers(1, 2)))]
            summary = [SummaryText(draw(texts)) for _ in range(draw(st.integers(1, 2)))]
            if shape == "content":
                out.append(Reasoning(summary=[], content=content))
            elif shape == "summary":
                out.append(Reasoning(summary=summary))
            elif shape == "both":
                out.append(Reasoning(summary=summary, content=content))
            else:
                out.append(Reasoning(summary=[], encrypted_content="gAAAA"))
        elif kind == "call":
            call_id = draw(st.one_of(st.just(f"call_{k}"), st.sampled_from(calls) if calls else st.just(f"call_{k}")))
            ns = draw(st.sampled_from([None, None, "mcp", "functions"]))
            out.append(
                FunctionCall(call_id=call_id, name=draw(names), arguments=draw(texts), namespace=ns)
            )
            calls.append(call_id)
        elif kind == "custom":
            call_id = f"ccall_{k}"
            out.append(CustomToolCall(call_id=call_id, name=draw(names), input=draw(texts)))
            calls.append(call_id)
        elif kind == "custom_output":
            call_id = draw(st.sampled_from(calls))
            out.append(CustomToolCallOutput(call_id=call_id, output=_parts(draw, assistant=False)))
        else:
            call_id = draw(st.sampled_from(calls))
            out.append(FunctionCallOutput(call_id=call_id, output=_parts(draw, assistant=False)))
    return out


@st.composite
def splits(draw: st.DrawFn, n: int) -> list[int]:
    """Sorted cut points in ``[0, n]`` (repeats allowed: an empty chunk is a warm-up)."""
    cuts = draw(st.lists(st.integers(min_value=0, max_value=n), max_size=6))
    return sorted(cuts)


instructions = st.one_of(st.none(), st.just(""), texts)


# -- resends: the same conversation as a client might send it again ---------------------------------

#: Variations no renderer sees (ids, statuses, one text part as a string, text-part kinds, annotations).
INVISIBLE = ("ids", "string", "part_kind", "annotations")
#: Variations a renderer may see (each is a different conversation for the model, or may be).
VISIBLE = ("phase", "split", "join", "space", "call_id", "arguments", "reasoning", "role")


def _text_parts(content: str | list[Any]) -> list[Any] | None:
    if isinstance(content, str) or not content or not all(isinstance(p, (InputText, OutputText)) for p in content):
        return None
    return list(content)


def vary_item(draw: st.DrawFn, item: Item, what: str) -> Item:
    """``item`` with one variation ``what`` applied (unchanged where it does not apply)."""
    rep = msgspec.structs.replace
    if what == "ids":
        return rep(item, id=draw(st.sampled_from(["x_1", "msg_abc", None])), status=draw(st.sampled_from(["completed", None])))
    if isinstance(item, Message):
        parts = _text_parts(item.content)
        if what == "string" and parts is not None and len(parts) == 1:
            return rep(item, content=parts[0].text)
        if what == "string" and isinstance(item.content, str):
            return rep(item, content=[OutputText(item.content) if item.role == "assistant" else InputText(item.content)])
        if what == "part_kind" and parts is not None:
            return rep(item, content=[OutputText(p.text) if isinstance(p, InputText) else InputText(p.text) for p in parts])
        if what == "annotations" and parts is not None:
            return rep(item, content=[OutputText(p.text, annotations=[{"type": "x"}], logprobs=[]) for p in parts])
        if what == "phase" and item.role == "assistant":
            return rep(item, phase=draw(st.sampled_from([None, "commentary", "final_answer"])))
        if what == "role":
            return rep(item, role=draw(st.sampled_from(["user", "system", "developer", "assistant"])))
        text_parts = [item.content] if isinstance(item.content, str) else parts
        if what == "split" and text_parts and len(text_parts[0] if isinstance(text_parts[0], str) else text_parts[0].text) >= 2:
            first = text_parts[0] if isinstance(text_parts[0], str) else text_parts[0].text
            cut = draw(st.integers(1, len(first) - 1))
            return rep(item, content=[InputText(first[:cut]), InputText(first[cut:]), *(text_parts[1:] if parts else [])])
        if what == "join" and parts is not None and len(parts) >= 2:
            return rep(item, content=[InputText(parts[0].text + parts[1].text), *parts[2:]])
        if what == "space" and text_parts:
            ws = draw(st.sampled_from(WHITESPACE))
            return rep(item, content=item.content + ws) if isinstance(item.content, str) else rep(
                item, content=[*item.content[:-1], InputText(parts[-1].text + ws)]  # type: ignore[index]
            )
        return item
    if isinstance(item, FunctionCall):
        if what == "arguments":
            return rep(item, arguments=item.arguments + draw(st.sampled_from([" ", "\n", "}"])))
        if what == "space":
            return rep(item, arguments=" " + item.arguments)
        if what == "role":  # the nearest thing a call has: its namespace
            return rep(item, namespace=draw(st.sampled_from([None, "functions", "mcp"])))
        return item
    if isinstance(item, FunctionCallOutput):
        if what == "string" and isinstance(item.output, str):
            return rep(item, output=[InputText(item.output)])
        if what == "space":
            return rep(item, output=(item.output if isinstance(item.output, str) else text_of(item.output)) + " ")
        return item
    if isinstance(item, Reasoning) and what == "reasoning":
        text = "".join(p.text for p in item.content or item.summary)
        return draw(
            st.sampled_from(
                [
                    Reasoning(summary=[SummaryText(text)]),
                    Reasoning(summary=[], content=[ReasoningText(text)]),
                    Reasoning(summary=list(item.summary), content=item.content, encrypted_content="gAAAA" + text[:4]),
                    Reasoning(summary=list(item.summary), content=[*(item.content or []), ReasoningText(" more")]),
                ]
            )
        )
    return item


@st.composite
def resent(draw: st.DrawFn, items: list[Item], kinds: tuple[str, ...] = INVISIBLE + VISIBLE) -> list[Item]:
    """``items`` as a client might resend them: a few random items varied (call ids renamed
    consistently, so every output still answers a call)."""
    out = list(items)
    for _ in range(draw(st.integers(0, 3))):
        if not out:
            break
        i = draw(st.integers(0, len(out) - 1))
        what = draw(st.sampled_from(kinds))
        item = out[i]
        if what == "call_id" and isinstance(item, FunctionCall):
            old, new = item.call_id, item.call_id + "_r"
            out = [
                msgspec.structs.replace(x, call_id=new) if isinstance(x, (FunctionCall, FunctionCallOutput)) and x.call_id == old else x
                for x in out
            ]
        else:
            out[i] = vary_item(draw, item, what)
    return out
