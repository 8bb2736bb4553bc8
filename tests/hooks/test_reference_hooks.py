"""Unit tests of the reference hooks: detection, redaction, thresholds, and bytes scanned per turn."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from strategies import SECRETS, conversations

from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Item,
    Message,
)
from responses_cache.safety import PatternPolicy, ScanState, SecretDetector, scanned_bytes
from responses_cache.testing import TEST_CONTEXT

KINDS = [
    ("sk-proj-A1b2C3d4E5f6G7h8I9j0K1l2", "openai_api_key"),
    ("sk-" + "Z" * 48, "openai_api_key"),
    ("sk-ant-api03-" + "x" * 24, "anthropic_api_key"),
    ("AKIAIOSFODNN7EXAMPLE", "aws_access_key_id"),
    ("ghp_" + "a" * 36, "github_token"),
    ("github_pat_" + "B" * 30, "github_token"),
    ("-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----", "private_key"),
    ("-----BEGIN EC PRIVATE KEY-----", "private_key"),
    ("authorization: bearer abcdefghijklmnop", "bearer_token"),
]


@pytest.mark.parametrize(("secret", "kind"), KINDS)
def test_detects_each_kind(secret: str, kind: str) -> None:
    assert SecretDetector().find(f"here: {secret} ok") == [kind]


@pytest.mark.parametrize(
    "text", ["sk-short", "task-manager", "ghp_short", "Bearer of news", "AKIA-not", "my-sk-"]
)
def test_no_false_positives_on_lookalikes(text: str) -> None:
    assert SecretDetector().find(text) == []


async def test_block_flags_user_text_and_tool_output_not_assistant() -> None:
    hook = SecretDetector()
    key = "ghp_" + "a" * 36
    v = await hook(TEST_CONTEXT, [Message(role="user", content=f"key {key}")], None)
    assert v.flagged and v.code == "secret_detected" and "github_token" in v.message
    v = await hook(TEST_CONTEXT, [FunctionCallOutput(call_id="c", output=f"env: {key}")], None)
    assert v.flagged
    v = await hook(TEST_CONTEXT, [Message(role="assistant", content=key)], None)
    assert not v.flagged and v.items is None


async def test_redact_replaces_secrets_in_returned_items() -> None:
    hook = SecretDetector("redact")
    items: list[Item] = [
        Message(role="user", content=[InputText("a AKIAIOSFODNN7EXAMPLE b"), InputText("clean")]),
        FunctionCallOutput(call_id="c", output="Authorization: Bearer abcdefghijklmnop\n"),
        Message(role="user", content="nothing here"),
        FunctionCall(call_id="c", name="f", arguments="sk-" + "Q" * 30),  # out of the default scope
    ]
    v = await hook(TEST_CONTEXT, items, None)
    assert not v.flagged and v.items is not None
    first, output, same, call = v.items
    assert isinstance(first, Message) and first.content == [
        InputText("a [REDACTED:aws_access_key_id] b"),
        InputText("clean"),
    ]
    assert isinstance(output, FunctionCallOutput)
    assert output.output == "Authorization: Bearer [REDACTED:bearer_token]\n"
    assert same is items[2] and call is items[3]
    assert isinstance(v.state, ScanState) and v.state.hits == 2 and not v.state.flagged
    # Redaction is idempotent and the redacted text holds no secret.
    again = await hook(TEST_CONTEXT, list(v.items), None)
    assert again.items is None and again.state.hits == 0


async def test_clean_redact_returns_no_items() -> None:
    v = await SecretDetector("redact")(TEST_CONTEXT, [Message(role="user", content="hi")], None)
    assert v.items is None


def test_redact_must_run_before() -> None:
    with pytest.raises(ValueError):
        SecretDetector("redact", phase="alongside")


async def test_pattern_policy_threshold_counts_across_turns() -> None:
    hook = PatternPolicy(keywords=["forbidden"], threshold=3, code="policy")
    state: Any = None
    flagged = []
    for text in ["forbidden", "ok", "FORBIDDEN and forbidden", "ok"]:
        v = await hook(TEST_CONTEXT, [Message(role="user", content=text)], state)
        flagged.append(v.flagged)
        state = v.state
    assert flagged == [False, False, True, True]
    assert v.code == "policy"


async def test_keywords_match_whole_words_and_commands() -> None:
    hook = PatternPolicy(keywords=["rm -rf /", "drop"])
    assert hook.count("please rm -rf / now") == 1
    assert hook.count("rm -rf /tmp/x") == 0
    assert hook.count("dropped, DROP!") == 1


def test_pattern_policy_needs_a_pattern() -> None:
    with pytest.raises(ValueError):
        PatternPolicy()


# -- counting: each turn scans exactly its new bytes ----------------------------------------


@settings(max_examples=40, deadline=None)
@given(conversation=conversations)
def test_bytes_scanned_per_turn_equal_new_bytes(conversation: list[list[Item]]) -> None:
    import asyncio

    async def run() -> None:
        for hook in (
            SecretDetector(),
            SecretDetector("redact"),
            PatternPolicy(keywords=["forbidden"], threshold=99),
        ):
            state: Any = None
            total = 0
            for new in conversation:
                before = hook.bytes_scanned
                v = await hook(TEST_CONTEXT, new, state)
                fresh = scanned_bytes(new, hook.scope)
                assert hook.bytes_scanned - before == fresh
                total += fresh
                assert v.state.bytes_scanned == total
                if v.flagged:
                    break  # a blocked turn ends the conversation here
                state = v.state

    asyncio.run(run())


async def test_work_per_turn_is_independent_of_history() -> None:
    """A long history costs nothing on the next turn: only the new bytes are scanned."""
    hook = SecretDetector()
    state: Any = None
    big = "x" * 10_000
    for _ in range(50):
        v = await hook(TEST_CONTEXT, [Message(role="user", content=big)], state)
        state = v.state
    before = hook.bytes_scanned
    await hook(TEST_CONTEXT, [Message(role="user", content="tiny")], state)
    assert hook.bytes_scanned - before == 4
    assert SECRETS  # the strategies salt texts with these
