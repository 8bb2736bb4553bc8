"""The testing kit: ``run_turns`` without sockets, the pytest plugin's fixtures, and hydration
(a parent rebuilt from storage carries no hook state: the hook is given the full history)."""

from __future__ import annotations

from typing import Any

import httpx

from responses_cache import create_app
from responses_cache.backends.base import Finish, TextDelta
from responses_cache.pipeline.hooks import HookRunner
from responses_cache.pipeline.pipeline import Pipeline
from responses_cache.protocol.items import Message
from responses_cache.safety import PatternPolicy, SecretDetector
from responses_cache.testing import ScriptedBackend, run_turns


async def test_run_turns_through_an_app_chains_and_skips_rejected_turns(
    recording_backend: Any,
) -> None:
    hook = PatternPolicy(keywords=["forbidden"])
    app = create_app(backend=recording_backend, renderer=None, hooks=[hook])
    results = await run_turns(
        app, ["one", "forbidden", [Message(role="user", content="two")], {"input": "three"}]
    )
    assert [r.error.code if r.error else r.types[-1] for r in results] == [
        "response.completed",
        "content_filter",
        "response.completed",
        "response.completed",
    ]
    assert results[2].response is not None
    assert results[2].response["previous_response_id"] == results[0].state.id  # type: ignore[union-attr]
    # Each hook call saw only the new items: one user message per accepted turn.
    last = recording_backend.requests[-1]
    users = [
        i.content for i in last.conversation.items() if isinstance(i, Message) and i.role == "user"
    ]
    assert users == ["one", "two", "three"]
    assert hook.bytes_scanned == len("one") + len("forbidden") + len("two") + len("three")


async def test_run_turns_with_a_bare_pipeline(scripted_backend: Any) -> None:
    backend: ScriptedBackend = scripted_backend([[TextDelta("hi"), Finish()]])
    pipeline = Pipeline(hooks=HookRunner([SecretDetector("redact")]))
    results = await run_turns(pipeline, ["key AKIAIOSFODNN7EXAMPLE", "thanks"], backend=backend)
    assert [r.types[-1] for r in results] == ["response.completed"] * 2
    assert backend.calls == 2
    state = results[-1].state
    assert state is not None
    first = state.conversation.items()[0]
    assert isinstance(first, Message) and first.content == "key [REDACTED:aws_access_key_id]"
    assert state.hook_state["secrets"].bytes_scanned == len("key AKIAIOSFODNN7EXAMPLE") + len(
        "thanks"
    )


async def test_hook_checker_fixture(hook_checker: Any) -> None:
    turns = [[Message(role="user", content="forbidden")], [Message(role="user", content="ok")]]
    assert await hook_checker.check(PatternPolicy(keywords=["forbidden"]), turns) == []
    results = await hook_checker.run(create_app(renderer=None), ["hello"])
    assert results[0].types[-1] == "response.completed"


def test_http_hydration_gives_hooks_the_full_history(responses_cache_server_factory: Any) -> None:
    """HTTP continuations hydrate from the store, so no hook state is carried: the runner passes
    the stored history, and a conversation-wide threshold still counts earlier turns."""
    hook = PatternPolicy(keywords=["forbidden"], threshold=2)
    server = responses_cache_server_factory(hooks=[hook])
    url = f"{server.http_url}/responses"
    r1 = httpx.post(url, json={"model": "sim-1", "input": "forbidden once"}, timeout=10)
    assert r1.status_code == 200
    r2 = httpx.post(
        url,
        json={"model": "sim-1", "input": "fine", "previous_response_id": r1.json()["id"]},
        timeout=10,
    )
    assert r2.status_code == 200
    r3 = httpx.post(
        url,
        json={
            "model": "sim-1",
            "input": "forbidden twice",
            "previous_response_id": r2.json()["id"],
        },
        timeout=10,
    )
    assert r3.status_code == 400 and r3.json()["error"]["code"] == "content_filter"
    # A fresh conversation is not affected.
    r4 = httpx.post(url, json={"model": "sim-1", "input": "forbidden once"}, timeout=10)
    assert r4.status_code == 200
