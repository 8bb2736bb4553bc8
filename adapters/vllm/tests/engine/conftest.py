"""The real-engine suite: a real ``vllm serve`` (the CPU build, in its own cached venv) serving a
tiny random-weight model built from the bundled offline vocabulary (``benchmarks/suite/vllmproc.py``).

Two engines, started together once per session:

* ``scale_out``: ``--enable-scale-out`` (tokens-in route ``/inference/v1/generate``) with the
  middleware (WebSocket mode in-process);
* ``stock``: a stock ``vllm serve`` (the tokens-in route answers 403) with the middleware, so
  both modes fall back to ``/v1/completions``.

Both serve vLLM's development endpoints (``pausable``): the steering test pauses the engine's
scheduler while its client creates and steers the target.

``target`` runs a test in each mode on each endpoint: ``network`` is ``responses-cache`` in front
of the engine over HTTP; ``in-process`` is the middleware inside vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_suite import KEY, MODEL, Target, network_backend

from benchmarks.suite import vllmproc
from responses_cache import create_app


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return vllmproc.provision()


@pytest.fixture(scope="session")
def tiny_oss(vllm_python: Path) -> Path:
    return vllmproc.tiny_model(vllm_python, MODEL)


@pytest.fixture(scope="session")
def engines(vllm_python: Path, tiny_oss: Path) -> Iterator[dict[str, vllmproc.VllmProcess]]:
    middleware = {"RESPONSES_CACHE_MODEL": MODEL}
    started = {
        "scale_out": vllmproc.VllmProcess(vllm_python, tiny_oss, scale_out=True, middleware=middleware, api_key=KEY,
                                          pausable=True),
        "stock": vllmproc.VllmProcess(vllm_python, tiny_oss, scale_out=False, middleware=middleware, api_key=KEY,
                                      pausable=True),
    }
    with vllmproc.started(*started.values()):
        yield started


@pytest.fixture(params=["network-generate", "in-process-generate", "network-completions", "in-process-completions"])
def target(request: pytest.FixtureRequest, engines: dict[str, vllmproc.VllmProcess],
           responses_cache_server_factory: Callable[..., Any]) -> Target:
    mode, endpoint = str(request.param).rsplit("-", 1)
    engine = engines["scale_out" if endpoint == "generate" else "stock"]
    if mode == "in-process":
        return Target(mode, endpoint, engine, engine.url + "/v1", engine.ws_url)
    server = responses_cache_server_factory(create_app(backend=network_backend(engine), renderer="harmony",
                                                       api_keys=[KEY]))
    return Target(mode, endpoint, engine, server.http_url, server.ws_url)
