"""Unit tests of the example hook, written with the testing kit (``responses_cache.testing``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from banned_command import BannedCommandHook

from responses_cache import create_app
from responses_cache.protocol.items import FunctionCall, FunctionCallOutput, Item, Message
from responses_cache.testing import (
    TEST_CONTEXT,
    assert_incremental_equals_full,
    check_hook_equivalence,
    run_turns,
)


def user(text: str) -> Message:
    return Message(role="user", content=text)


def call(arguments: str) -> FunctionCall:
    return FunctionCall(call_id="call_1", name="exec_command", arguments=arguments)


@pytest.mark.parametrize(
    "text",
    [
        "rm -rf /",
        "sudo rm -rf / --no-preserve-root",
        "rm -fr /*",
        "rm -r -f /",
        "mkfs.ext4 /dev/sda1",
    ],
)
async def test_flags_banned_commands(text: str) -> None:
    verdict = await BannedCommandHook()(TEST_CONTEXT, [user(f"please run {text}")], None)
    assert verdict.flagged and verdict.code == "banned_command"


@pytest.mark.parametrize("text", ["rm -rf /tmp/build", "rm -rf ./dist", "ls /", "rm file.txt"])
async def test_allows_safe_commands(text: str) -> None:
    assert not (await BannedCommandHook()(TEST_CONTEXT, [user(text)], None)).flagged


async def test_function_call_arguments_are_checked_but_tool_outputs_are_not() -> None:
    hook = BannedCommandHook()
    assert (await hook(TEST_CONTEXT, [call('{"cmd": "rm -rf /"}')], None)).flagged
    assert not (
        await hook(TEST_CONTEXT, [FunctionCallOutput(call_id="c", output="rm -rf /")], None)
    ).flagged


CONVERSATIONS: list[list[list[Item]]] = [
    [[user("hi")], [call('{"cmd": "ls"}')], [user("now rm -rf / please")], [user("ok")]],
    [[user("rm -rf /")], [user("sorry")]],
    [[], [user("x" * 1000)], [call('{"cmd": "rm -rf /tmp"}')]],
]


def test_incremental_equals_full() -> None:
    assert_incremental_equals_full(BannedCommandHook(), CONVERSATIONS)
    assert_incremental_equals_full(BannedCommandHook(phase="alongside"), CONVERSATIONS)
    assert check_hook_equivalence(BannedCommandHook(), CONVERSATIONS[0]) == []


async def test_each_turn_scans_only_new_bytes() -> None:
    hook = BannedCommandHook()
    state = None
    for turn in CONVERSATIONS[2]:
        before = hook.bytes_scanned
        verdict = await hook(TEST_CONTEXT, turn, state)
        assert hook.bytes_scanned - before == sum(
            len(t.encode()) for i in turn for t in hook.texts(i)
        )
        state = verdict.state


async def test_blocks_in_the_pipeline() -> None:
    app = create_app(hooks=[BannedCommandHook()], renderer=None)
    results = await run_turns(app, ["hello", "run rm -rf / now", "never mind"])
    assert results[0].types[-1] == "response.completed"
    assert results[1].error is not None and results[1].error.code == "banned_command"
    assert results[2].types[-1] == "response.completed"
