"""Start and stop the benchmark server in a subprocess (so client and server never share a GIL).

A server runs from a source tree: this checkout's by default, or another checkout's
(``--baseline-tree``: e.g. ``git worktree add /tmp/base HEAD~1``), so two commits can be measured
side by side in one run. The child imports ``responses_cache`` and the suite's runner from that
tree (first on its ``sys.path``, and its working directory, so neither this checkout nor an
editable install shadows it), reports the files they came from, and the parent checks them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol, TypeVar

from .footprint import rss_bytes
from .runner import ServerSpec

#: This checkout: the source tree a server runs from unless told otherwise.
ROOT = Path(__file__).resolve().parents[2]
# Not ``-m benchmarks.suite.runner``: the package imports the runner first (runpy warns). The
# child first prints where ``responses_cache`` and the runner came from (``ORIGIN {json}``), then
# hands the runner the spec less the fields that tree's ``ServerSpec`` lacks, which must hold
# this tree's defaults (``argv[2]``), so a spec is understood by an older or newer tree alike.
_CHILD = """
import dataclasses, json, sys
import responses_cache
from benchmarks.suite import runner
print("ORIGIN " + json.dumps({"responses_cache": responses_cache.__file__, "runner": runner.__file__}), flush=True)
spec, defaults = json.loads(sys.argv[1]), json.loads(sys.argv[2])
known = {f.name for f in dataclasses.fields(runner.ServerSpec)}
unknown = sorted(k for k, v in spec.items() if k not in known and v != defaults.get(k))
if unknown:
    sys.exit(f"this tree's ServerSpec has no field {unknown} (set in the spec)")
sys.exit(runner.main([json.dumps({k: v for k, v in spec.items() if k in known})]))
"""


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
    """``with ServerProcess(spec) as server:`` — a live server on ``127.0.0.1:server.port``.

    ``tree``: the source tree to run (default: this checkout). After :meth:`start`, ``origin``
    holds the files the child imported ``responses_cache`` and the runner from (both checked to
    lie inside ``tree``).
    """

    def __init__(
        self, spec: ServerSpec, *, tree: Path = ROOT, startup_timeout: float = 60.0
    ) -> None:
        self.spec = spec
        self.tree = tree.resolve()
        self.startup_timeout = startup_timeout
        self.port = 0
        self.origin: dict[str, str] = {}
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
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        """Start the child without waiting for it (:func:`started` starts several at once)."""
        env = dict(os.environ)
        env.setdefault("PYTHONHASHSEED", "0")
        # The suite lives in the source tree, not in the wheel: the child imports it from there
        # (the tree first on PYTHONPATH, and its cwd: ``-c`` puts the cwd first on sys.path).
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.tree), env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, self.spec.to_json(), ServerSpec().to_json()],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=self.tree,
        )

    def wait_ready(self) -> ServerProcess:
        """Check where the launched child imported from, read its port, and return once it
        answers (:class:`RuntimeError`, the child stopped, if it does not)."""
        assert self._proc is not None and self._proc.stdout is not None, "launch() first"
        line = self._proc.stdout.readline()
        if line.startswith("ORIGIN "):
            self.origin = json.loads(line[len("ORIGIN ") :])
            line = self._proc.stdout.readline()
        outside = [
            f"{name} from {path}"
            for name, path in self.origin.items()
            if not Path(path).resolve().is_relative_to(self.tree)
        ]
        if outside or not self.origin:
            self.stop()
            raise RuntimeError(
                f"benchmark server for {self.tree} imported "
                + (", ".join(outside) if outside else f"nothing it reported (printed {line!r})")
            )
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

    def close(self) -> None:
        """Stop the child: all there is to clean up (what :func:`started` calls)."""
        self.stop()

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


class Launchable(Protocol):
    """A child process started in two steps, so that several start at once: :class:`ServerProcess`,
    ``vllmproc.VllmProcess``, ``llamaproc.LlamaServer``."""

    def launch(self) -> None: ...
    def wait_ready(self) -> object: ...
    def close(self) -> None: ...


L = TypeVar("L", bound=Launchable)


@contextlib.contextmanager
def started(*processes: L) -> Iterator[tuple[L, ...]]:
    """Start several servers or engines at once (their start-ups overlap: each is a child
    importing its package or loading its model), close them all at the end, the last first.
    Nothing is measured before all are ready."""
    try:
        for process in processes:
            process.launch()
        for process in processes:
            process.wait_ready()
        yield processes
    finally:
        for process in reversed(processes):
            process.close()


#: The two trees of a side-by-side run: this checkout, and the ``--baseline-tree`` one.
CURRENT = "current"
BASELINE = "baseline"


@contextlib.contextmanager
def servers(spec: ServerSpec, baseline_tree: str | None) -> Iterator[dict[str, ServerProcess]]:
    """``{"current": server}`` from this checkout, plus ``"baseline"`` from ``baseline_tree`` when
    given (same spec, started together; each server's origin printed, so the run shows which code
    it measured)."""
    by_tree = {CURRENT: ServerProcess(spec)}
    if baseline_tree is not None:
        by_tree[BASELINE] = ServerProcess(spec, tree=Path(baseline_tree))
    with started(*by_tree.values()):
        if baseline_tree is not None:
            for name, server in by_tree.items():
                print(
                    f"[bench] {name} server (pid {server.pid}): responses_cache from "
                    f"{server.origin['responses_cache']}, runner from {server.origin['runner']}",
                    file=sys.stderr,
                )
        yield by_tree
