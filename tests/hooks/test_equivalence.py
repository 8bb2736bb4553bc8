"""Property: every reference hook's incremental verdict (carried state, new items only) equals its
verdict on the full history, turn after turn — for both phases and every policy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from strategies import conversations

from responses_cache.pipeline.hooks import HookRunner
from responses_cache.protocol.errors import ResponsesError
from responses_cache.protocol.items import Item, Message
from responses_cache.safety import ModerationHook, PatternPolicy, SecretDetector
from responses_cache.safety.base import texts_of
from responses_cache.testing import TEST_CONTEXT, check_hook_equivalence

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fake_moderation(word: str = "BADWORD") -> httpx.AsyncClient:
    """A moderation 'service' in-process: flags any input text containing ``word``."""

    def handle(request: httpx.Request) -> httpx.Response:
        import json

        texts = json.loads(request.content)["input"]
        return httpx.Response(200, json={"results": [{"flagged": word in t} for t in texts]})

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def _hooks() -> list[tuple[str, Any]]:
    return [
        ("secrets-block", lambda: SecretDetector("block")),
        ("secrets-block-alongside", lambda: SecretDetector("block", phase="alongside")),
        ("secrets-redact", lambda: SecretDetector("redact")),
        (
            "secrets-redact-all-scopes",
            lambda: SecretDetector("redact", scope=("user", "system", "tool_output", "tool_call")),
        ),
        ("keywords", lambda: PatternPolicy(keywords=["forbidden", "rm -rf /"])),
        (
            "keywords-threshold-3",
            lambda: PatternPolicy(keywords=["forbidden", "BADWORD"], threshold=3),
        ),
        (
            "regex-alongside",
            lambda: PatternPolicy([r"sk-\w+"], phase="alongside", scope=("user", "assistant")),
        ),
        (
            "moderation",
            lambda: ModerationHook(
                "http://moderation.test/v1/moderations", client=_fake_moderation()
            ),
        ),
        (
            "moderation-alongside",
            lambda: ModerationHook(
                "http://moderation.test/", client=_fake_moderation(), phase="alongside"
            ),
        ),
    ]


@pytest.mark.parametrize(("label", "make"), _hooks(), ids=[label for label, _ in _hooks()])
@SETTINGS
@given(conversation=conversations)
def test_incremental_equals_full(label: str, make: Any, conversation: list[list[Item]]) -> None:
    mismatches = check_hook_equivalence(make(), conversation)
    assert not mismatches, [str(m) for m in mismatches]


@SETTINGS
@given(conversation=conversations)
def test_equivalence_holds_when_flagged_turns_are_kept(conversation: list[list[Item]]) -> None:
    """Sticky flags: a continued flagged conversation stays flagged, as a full rescan would say."""
    for hook in (SecretDetector(), PatternPolicy(keywords=["forbidden"], threshold=2)):
        assert not check_hook_equivalence(hook, conversation, keep_flagged=True)


@SETTINGS
@given(conversation=conversations)
def test_runner_hydration_equals_carried_state(conversation: list[list[Item]]) -> None:
    """A parent without the hook's state (hydrated from storage) gets the full history: the
    runner's verdict then equals the one with carried state, and both equal what counting the
    keyword over the whole conversation says (so a runner that always refuses cannot pass)."""
    import asyncio

    from responses_cache.conversation import EMPTY

    async def run() -> None:
        hook = PatternPolicy(keywords=["forbidden"], threshold=2)
        runner = HookRunner([hook])
        history = EMPTY
        states: dict[str, Any] = {}
        for new in conversation:
            hits = sum(hook.count(t) for item in [*history.items(), *new] for t in texts_of(item, hook.scope))
            verdicts: list[tuple[str | None, str] | int] = []
            carried = states
            for start in (states, {}):  # the carried state, then none (hydrated from the history)
                try:
                    _, after = await runner.run_before(TEST_CONTEXT, list(new), start, history=history)
                except ResponsesError as exc:
                    verdicts.append((exc.code, exc.message))
                else:
                    verdicts.append(after[hook.name].hits)
                    carried = after if start is states else carried
            if hits >= hook.threshold:
                assert verdicts == [(hook.code, hook.message)] * 2
                continue  # rejected: the client continues the previous response
            assert verdicts == [hits, hits]
            states = carried
            history = history.extend(new)

    asyncio.run(run())


async def test_hydrating_redactor_returns_only_new_items() -> None:
    """A redacting hook given the full history still replaces only the new items."""
    from responses_cache.conversation import EMPTY

    runner = HookRunner([SecretDetector("redact")])
    history = EMPTY.extend([Message(role="user", content="old ghp_" + "a" * 36)])
    new: list[Item] = [Message(role="user", content="new AKIAIOSFODNN7EXAMPLE")]
    items, states = await runner.run_before(TEST_CONTEXT, new, {}, history=history)
    assert [i.content for i in items if isinstance(i, Message)] == [
        "new [REDACTED:aws_access_key_id]"
    ]
    assert states["secrets"].bytes_scanned == len(b"old ghp_") + 36 + len(
        b"new AKIAIOSFODNN7EXAMPLE"
    )
    # With carried state, only the new item is scanned.
    items2, states2 = await runner.run_before(TEST_CONTEXT, new, states, history=history)
    assert [i.content for i in items2 if isinstance(i, Message)] == [
        "new [REDACTED:aws_access_key_id]"
    ]
    assert states2["secrets"].bytes_scanned - states["secrets"].bytes_scanned == len(
        b"new AKIAIOSFODNN7EXAMPLE"
    )


def test_checker_reports_a_non_incremental_hook() -> None:
    """The checker itself: a hook that forgets its state is caught."""
    from responses_cache.pipeline.hooks import HookContext, Verdict

    class Forgetful:
        name = "forgetful"
        phase: Any = "before"

        async def __call__(
            self, ctx: HookContext, new_items: Sequence[Item], state: Any
        ) -> Verdict:
            return Verdict(flagged=len(new_items) >= 2)  # counts only what it was given

    msg: list[Item] = [Message(role="user", content="x")]
    mismatches = check_hook_equivalence(Forgetful(), [msg, msg])
    assert [(m.turn, m.field) for m in mismatches] == [(1, "flagged")]
