"""Hypothesis strategies: conversations (lists of turns of items) salted with secrets/keywords."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Item,
    Message,
    OutputText,
)

SECRETS = [
    "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2",
    "sk-ant-api03-" + "x" * 24,
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_" + "a" * 36,
    "github_pat_" + "B" * 30,
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN OPENSSH PRIVATE KEY-----",
    "Authorization: Bearer abcdefghijklmnop",
]
WORDS = [
    "forbidden",
    "rm -rf /",
    "BADWORD",
    "fine",
    "hello",
    "sk-",
    "ghp_",
    "Bearer",
    " ",
    "\n",
    "é",
]

plain = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
fragment = st.one_of(plain, st.sampled_from(SECRETS), st.sampled_from(WORDS))
texts = st.lists(fragment, max_size=4).map("".join)


def _message(role: Any) -> st.SearchStrategy[Item]:
    as_str = texts.map(lambda t: Message(role=role, content=t))
    parts = st.lists(texts, min_size=1, max_size=3).map(
        lambda ts: Message(
            role=role,
            content=[OutputText(t) if role == "assistant" else InputText(t) for t in ts],
        )
    )
    return st.one_of(as_str, parts)


items: st.SearchStrategy[Item] = st.one_of(
    _message("user"),
    _message("assistant"),
    _message("developer"),
    texts.map(lambda t: FunctionCallOutput(call_id="call_1", output=t)),
    texts.map(lambda t: FunctionCall(call_id="call_1", name="exec", arguments=t)),
)
turns = st.lists(items, min_size=0, max_size=4)
conversations = st.lists(turns, min_size=1, max_size=6)
