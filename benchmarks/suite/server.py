"""Start and stop the benchmark server in a subprocess (so client and server never share a GIL)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from .footprint import rss_bytes
from .runner import ServerSpec

# Not ``-m benchmarks.suite.runner``: the package imports the runner first (runpy warns).
_ROOT = Path(__file__).resolve().parents[2]
_CHILD = "import sys; from benchmarks.suite.runner import main; sys.exit(main(sys.argv[1:]))"


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """Ask a child process to exit (SIGTERM), and kill it if it has not within ``timeout``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _forward(stream: IO[str]) -> None:
    """Copy the server's stdout to our stderr (a full pipe would block the server)."""
    with contextlib.suppress(ValueError, OSError):
        for line in stream:
            sys.stderr.write(f"[server] {line}")


class ServerProcess:
    """``with ServerProcess(spec) as server:`` — a live server on ``127.0.0.1:server.port``."""

    def __init__(self, spec: ServerSpec, *, startup_timeout: float = 60.0) -> None:
        self.spec = spec
        self.startup_timeout = startup_timeout
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    def start(self) -> ServerProcess:
        env = dict(os.environ)
        env.setdefault("PYTHONHASHSEED", "0")
        # The suite lives in the source tree, not in the wheel: the child imports it from there.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, self.spec.to_json()],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"benchmark server failed to start (printed {line!r})")
        self.port = int(line.split()[1])
        threading.Thread(target=_forward, args=(self._proc.stdout,), daemon=True).start()
        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                self.get("/_bench/stats")
                return self
            except OSError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("benchmark server did not become ready") from None
                time.sleep(0.05)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def get(self, path: str) -> dict[str, Any]:
        return self._call("GET", path)

    def post(self, path: str) -> dict[str, Any]:
        return self._call("POST", path)

    def _call(self, method: str, path: str) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            method=method,
            data=b"" if method == "POST" else None,
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            body: dict[str, Any] = json.loads(response.read())
        return body

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
