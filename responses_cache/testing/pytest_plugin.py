"""pytest fixtures for testing hooks, stages and backends with ``responses_cache.testing``.

Enabled through the ``pytest11`` entry point (``responses_cache = "responses_cache.testing.pytest_plugin"``)
or with ``pytest -p responses_cache.testing.pytest_plugin``:

* ``recording_backend``: a :class:`~responses_cache.testing.RecordingBackend` over an instant
  simulated engine;
* ``scripted_backend``: a factory, ``scripted_backend([[TextDelta("hi"), Finish()], ...])``;
* ``hook_checker``: a :class:`HookChecker` with ``check``/``assert_equivalent``/``run``;
* ``responses_cache_server_factory``: ``responses_cache_server_factory(app)`` or ``responses_cache_server_factory(**create_app
  options)`` runs a server on a free loopback port for the test (instant simulated engine by
  default) and stops it afterwards; ``responses_cache_server`` is one with the defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pytest

from ..backends.base import BackendEvent
from ..pipeline.hooks import Hook
from ..protocol.items import Item
from . import (
    LiveServer,
    Mismatch,
    RecordingBackend,
    ScriptedBackend,
    TurnInput,
    TurnResult,
    assert_incremental_equals_full,
    hook_equivalence,
    run_turns,
    serve_in_thread,
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


@pytest.fixture
def responses_cache_server_factory() -> Iterator[Callable[..., LiveServer]]:
    """``responses_cache_server_factory(app)`` or ``responses_cache_server_factory(**create_app_options)``: a running
    server, stopped at teardown. The default engine is the instant simulated engine."""
    from ..backends.simulated import SimulatedConfig, SimulatedEngine
    from ..edge.app import create_app

    servers: list[LiveServer] = []

    def factory(app: Any = None, **options: Any) -> LiveServer:
        if app is None:
            options.setdefault("backend", SimulatedEngine(SimulatedConfig(instant=True)))
            app = create_app(**options)
        server = serve_in_thread(app)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.stop()


@pytest.fixture
def responses_cache_server(responses_cache_server_factory: Callable[..., LiveServer]) -> LiveServer:
    return responses_cache_server_factory()
