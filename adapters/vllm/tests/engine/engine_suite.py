"""Helpers of the real-engine suite (the fixtures are in ``conftest.py``)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai import OpenAI
from responses_cache_vllm import EngineBackend

from benchmarks.suite import vllmproc
from benchmarks.suite.server import started
from tests.websocket.wsclient import TERMINAL, check_event, check_stream

MODEL = "tiny-oss"
KEY = "sk-engine"
#: Greedy decoding never samples the tiny model's stop token: a generation that runs until it is
#: stopped (or reaches max_output_tokens).
ENDLESS = {"temperature": 0, "max_output_tokens": 3000}
#: The engines' niceness: started while the rest of the suite runs, they take the CPU it leaves.
#: In a pytest-xdist worker (the root ``conftest.py``) they start when that worker reaches the
#: engine tests and the worker waits for them while the other runs the rest: they run at the
#: same priority as the tests then, or their start-up would wait for the whole suite.
NICE = 0 if "PYTEST_XDIST_WORKER" in os.environ else 19

Build = Callable[[Path], dict[str, vllmproc.VllmProcess]]
#: The engine groups fixtures take from :class:`Prelaunch`: a fixture's name -> its engines, built
#: (not started) from the vLLM venv's python. Registered with :func:`group` by the modules that
#: use them.
GROUPS: dict[str, Build] = {}


def group(fixture: str) -> Callable[[Build], Build]:
    """Register the engines that the fixture named ``fixture`` serves (see :data:`GROUPS`)."""

    def register(build: Build) -> Build:
        GROUPS[fixture] = build
        return build

    return register


class Prelaunch:
    """The engines the collected tests use, launched in a background thread as soon as the tests
    are collected (``conftest.py``). An engine's start-up is CPU-bound (tens of seconds on 2 cores)
    and the tests that run before the engine suite leave about a core idle: started then, at
    :data:`NICE`, the start-ups use that core instead of holding up the engine suite's first
    set-ups. A fixture takes its group with :meth:`take`; :meth:`close` stops what is left."""

    def __init__(self, names: Iterable[str]) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="vllm-prelaunch")
        self._python = self._pool.submit(vllmproc.provision)
        self._groups: dict[str, Future[dict[str, vllmproc.VllmProcess]]] = {}
        for name in names:
            self._submit(name)

    def _submit(self, name: str) -> Future[dict[str, vllmproc.VllmProcess]]:
        if name not in self._groups:
            self._groups[name] = self._pool.submit(self._launch, GROUPS[name])
        return self._groups[name]

    def _launch(self, build: Build) -> dict[str, vllmproc.VllmProcess]:
        engines = build(self._python.result())
        try:
            for engine in engines.values():
                engine.launch()
        except BaseException:
            for engine in engines.values():
                engine.stop()
            raise
        return engines

    @contextlib.contextmanager
    def take(self, name: str) -> Iterator[dict[str, vllmproc.VllmProcess]]:
        """The group ``name`` once all its engines answer; stopped at the end."""
        engines = self._submit(name).result()
        with started(*engines.values()):
            yield engines

    def close(self) -> None:
        """Stop every engine launched (those stopped already are left alone)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for future in self._groups.values():
            if future.done() and not future.cancelled() and future.exception() is None:
                for engine in future.result().values():
                    engine.close()


@dataclass
class Target:
    """Where a test's WebSocket connects, and the engine behind it."""

    mode: str  # "network" or "in-process"
    endpoint: str  # "generate", "completions" or "engine" (in-process: vLLM's engine client)
    engine: vllmproc.VllmProcess
    http_url: str  # base URL for the SDK (…/v1)
    ws_url: str


def network_backend(*engines: vllmproc.VllmProcess, **options: Any) -> EngineBackend:
    options.setdefault("template", "harmony")
    return EngineBackend([e.url for e in engines], model=MODEL, api_key=KEY, **options)


def sdk(http_url: str, key: str = KEY) -> OpenAI:
    return OpenAI(base_url=http_url, api_key=key, max_retries=0)


def turn(conn: Any, **body: Any) -> dict[str, Any]:
    """One response over an SDK connection: every frame validated strictly; its final response."""
    conn.response.create(**{"model": MODEL, "store": False, **body})
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(conn.recv_bytes())
        check_event(event)
        assert event["type"] != "error", event
        events.append(event)
        if event["type"] in TERMINAL:
            return check_stream(events)


def next_event(conn: Any, *kinds: str) -> dict[str, Any]:
    """Read (and validate) frames until one of ``kinds``."""
    while True:
        event = json.loads(conn.recv_bytes())
        check_event(event)
        if event["type"] in kinds:
            return dict(event)
