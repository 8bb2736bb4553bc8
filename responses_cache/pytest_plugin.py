"""pytest fixtures for testing hooks, stages and backends with ``responses_cache.testing``.

Enabled through the ``pytest11`` entry point (``responses_cache = "responses_cache.pytest_plugin"``)
or with ``pytest -p responses_cache.pytest_plugin``:

* ``recording_backend``: a :class:`~responses_cache.testing.RecordingBackend` over an instant
  simulated engine;
* ``scripted_backend``: a factory, ``scripted_backend([[TextDelta("hi"), Finish()], ...])``;
* ``hook_checker``: a :class:`HookChecker` with ``check``/``assert_equivalent``/``run``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from .backends.base import BackendEvent
from .pipeline.hooks import Hook
from .protocol.items import Item
from .testing import (
    Mismatch,
    RecordingBackend,
    ScriptedBackend,
    TurnInput,
    TurnResult,
    assert_incremental_equals_full,
    hook_equivalence,
    run_turns,
)


class HookChecker:
    """Checks hooks' incremental contract; ``check`` is a coroutine (use it in async tests),
    ``assert_equivalent`` is synchronous (use it in sync and hypothesis tests)."""

    async def check(
        self, hook: Hook, turns: Sequence[Sequence[Item]], *, keep_flagged: bool | None = None
    ) -> list[Mismatch]:
        return await hook_equivalence(hook, turns, keep_flagged=keep_flagged)

    def assert_equivalent(
        self,
        hook: Hook,
        conversations: Iterable[Sequence[Sequence[Item]]],
        *,
        keep_flagged: bool | None = None,
    ) -> None:
        assert_incremental_equals_full(hook, conversations, keep_flagged=keep_flagged)

    async def run(
        self, target: Any, turns: Sequence[TurnInput], **options: Any
    ) -> list[TurnResult]:
        """:func:`~responses_cache.testing.run_turns`."""
        return await run_turns(target, turns, **options)


@pytest.fixture
def recording_backend() -> RecordingBackend:
    return RecordingBackend()


@pytest.fixture
def scripted_backend() -> Callable[..., ScriptedBackend]:
    def factory(
        scripts: Sequence[Sequence[BackendEvent]], models: Sequence[str] = ("sim-1",)
    ) -> ScriptedBackend:
        return ScriptedBackend(scripts, models)

    return factory


@pytest.fixture
def hook_checker() -> HookChecker:
    return HookChecker()
