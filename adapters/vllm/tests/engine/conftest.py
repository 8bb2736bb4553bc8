"""The real-engine suite: a real ``vllm serve`` (the CPU build, in its own cached venv) serving a
tiny random-weight model built from the bundled offline vocabulary (``benchmarks/suite/vllmproc.py``).

Two engines, once per session:

* ``scale_out``: ``--enable-scale-out`` (tokens-in route ``/inference/v1/generate``) with the
  middleware (WebSocket mode in-process) told to call that route in-process;
* ``stock``: a stock ``vllm serve`` (the tokens-in route answers 403) with the middleware, which
  generates through vLLM's engine client (its default); network mode falls back to
  ``/v1/completions``.

Both serve vLLM's development endpoints (``pausable``): the steering test pauses the engine's
scheduler while its client creates and steers the target. Both start fast (``fast_start``: eager,
the worker inside the engine-core process, a small KV cache).

Every engine of the suite (these two and the groups of ``test_engine_failures.py`` and
``test_hf_models.py``) is launched in the background as soon as the tests are collected
(``engine_suite.Prelaunch``): the start-ups overlap the tests that run before the engine suite.
Under pytest-xdist (the root ``conftest.py``: the engine tests are one unit of work) they are
launched by the worker that runs the engine tests, at its first engine fixture, while the other
worker runs the rest of the suite: every worker collects every test, and only one may start them.

``target`` runs a test in each mode on each endpoint: ``network`` is ``responses-cache`` in front
of the engine over HTTP (``generate``, ``completions``); ``in-process`` is the middleware inside
vLLM (``generate``: vLLM's route in-process; ``engine``: vLLM's engine client).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_suite import GROUPS, KEY, MODEL, NICE, Prelaunch, Target, group, network_backend

from benchmarks.suite import vllmproc
from responses_cache import create_app

PRELAUNCH = pytest.StashKey[Prelaunch]()
#: This suite's directory: the tests whose engines are launched.
HERE = Path(__file__).resolve().parent
#: The engine groups the collected tests use, in the order they first use them.
GROUPS_USED = pytest.StashKey[list[str]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Launch the engines the collected tests use, in the order they first use them (in an xdist
    worker: note them, for the ``prelaunch`` fixture)."""
    if not session.config.option.collectonly:
        # Only this suite's tests: a fixture elsewhere may share a group's name (tests/faults has
        # an ``engines`` of its own) and must not start a real engine.
        ours = (item for item in session.items if HERE in item.path.resolve().parents)
        names = dict.fromkeys(n for item in ours for n in getattr(item, "fixturenames", ()) if n in GROUPS)
        session.config.stash[GROUPS_USED] = list(names)
        if not hasattr(session.config, "workerinput"):
            session.config.stash[PRELAUNCH] = Prelaunch(names)


def pytest_sessionfinish(session: pytest.Session) -> None:
    prelaunch = session.config.stash.get(PRELAUNCH, None)
    if prelaunch is not None:
        prelaunch.close()


@pytest.fixture(scope="session")
def prelaunch(pytestconfig: pytest.Config) -> Prelaunch:
    """The session's :class:`Prelaunch` (launched here, at the first engine fixture, in an xdist
    worker: the one that runs the engine tests)."""
    if PRELAUNCH not in pytestconfig.stash:
        pytestconfig.stash[PRELAUNCH] = Prelaunch(pytestconfig.stash[GROUPS_USED])
    return pytestconfig.stash[PRELAUNCH]


@group("engines")
def _pair(python: Path) -> dict[str, vllmproc.VllmProcess]:
    model = vllmproc.tiny_model(python, MODEL)
    # In ``stock`` the middleware generates through vLLM's engine client (its default, which needs
    # no tokens-in route); in ``scale_out`` through vLLM's ``/inference/v1/generate``, in-process.
    middleware = {"scale_out": {"RESPONSES_CACHE_MODEL": MODEL, "RESPONSES_CACHE_ENDPOINT": "generate"},
                  "stock": {"RESPONSES_CACHE_MODEL": MODEL}}
    return {name: vllmproc.VllmProcess(python, model, scale_out=name == "scale_out", middleware=middleware[name],
                                       api_key=KEY, pausable=True, fast_start=True, nice=NICE)
            for name in ("scale_out", "stock")}


@pytest.fixture(scope="session")
def engines(prelaunch: Prelaunch) -> Iterator[dict[str, vllmproc.VllmProcess]]:
    with prelaunch.take("engines") as started:
        yield started


@pytest.fixture(params=["network-generate", "in-process-generate", "network-completions", "in-process-engine"])
def target(request: pytest.FixtureRequest, engines: dict[str, vllmproc.VllmProcess],
           responses_cache_server_factory: Callable[..., Any]) -> Target:
    mode, endpoint = str(request.param).rsplit("-", 1)
    engine = engines["scale_out" if endpoint == "generate" else "stock"]
    if mode == "in-process":
        return Target(mode, endpoint, engine, engine.url + "/v1", engine.ws_url)
    server = responses_cache_server_factory(create_app(backend=network_backend(engine), renderer="harmony",
                                                       api_keys=[KEY]))
    return Target(mode, endpoint, engine, server.http_url, server.ws_url)
