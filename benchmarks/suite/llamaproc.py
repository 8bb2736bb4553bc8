"""A real llama.cpp ``llama-server`` (CPU) for the engine suite: built, fed a tiny GGUF, served.

* :func:`provision` builds ``llama-server`` from the source that the ``llama-cpp-python``
  source distribution on PyPI vendors (``vendor/llama.cpp``: the server, ``convert_hf_to_gguf.py``
  and ``gguf-py``; llama.cpp is MIT), CPU only and only the server target, into the engine cache
  (``ENGINE_SUITE_CACHE``, default ``~/.cache/responses-cache/engines``) under
  ``llama.cpp-<version>``: about 4 minutes on 2 cores the first time, nothing after.
  ``cuda=True`` builds it with CUDA for the GPU it runs on (``llama.cpp-<version>-cuda``);
  ``source``: an archive that :func:`pack_source` wrote, instead of the download (a machine with
  no registry: the GPU run of ``benchmarks/gpu/llama_cuda.sh``).
* :func:`gguf_model` converts a Hugging Face model directory with random weights (the suite's
  tiny models, ``vllmproc.tiny_model`` / ``vllmproc.hf_models``) into a GGUF with
  ``convert_hf_to_gguf.py``, run by a Python that has torch and transformers (the vLLM venv's),
  cached by the directory's bytes: no download of weights.
* :class:`LlamaServer` runs ``llama-server`` on a loopback port with prompt caching and ``slots``
  parallel slots, ready once ``/health`` answers 200.

Extra pip arguments for the source download (a mirror): ``ENGINE_SUITE_PIP_ARGS``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from responses_cache.testing import free_port

from .vllmproc import _locked, _run, cache_root

#: The ``llama-cpp-python`` release whose source distribution vendors the llama.cpp we build.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
#: CPU only, portable (no ``-march=native``: the cache may move between machines), no libcurl
#: (models are local files), only what the server needs.
CMAKE_FLAGS = ("-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF",
               "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DBUILD_SHARED_LIBS=OFF")
#: The server's log line for each task's prompt: ``prompt eval time = 6.46 ms / 18 tokens (…``.
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")
#: With ``cuda=True``: the GPU kernels for the GPU the build runs on only, and no multi-GPU
#: collectives.
CUDA_FLAGS = ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=native", "-DGGML_CUDA_NCCL=OFF")
#: The build's niceness and parallelism: it shares a small machine with the rest of the suite.
BUILD_NICE = 10
BUILD_JOBS = 2
#: What :func:`pack_source` leaves out of the tree: the build, models, docs, tests and the other
#: accelerators' backends (what ``llama-server`` on CPU or CUDA does not compile).
_UNPACKED = ("build", "models", "docs", "tests", "media", "examples", "pocs", "benches",
             *(f"ggml/src/ggml-{backend}" for backend in ("blas", "cann", "et", "hexagon", "hip", "metal", "musa",
                                                          "opencl", "openvino", "rpc", "sycl", "virtgpu", "vulkan",
                                                          "webgpu", "zdnn", "zendnn")))


class Build:
    """Where a built llama.cpp lives: ``server`` (the binary), ``source`` (the vendored tree,
    with ``convert_hf_to_gguf.py`` and ``gguf-py``)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.source = home / "llama.cpp"
        self.server = self.source / "build" / "bin" / "llama-server"

    @property
    def converter(self) -> Path:
        return self.source / "convert_hf_to_gguf.py"

    @property
    def gguf_py(self) -> Path:
        return self.source / "gguf-py"


def provision(version: str = LLAMA_CPP_PYTHON_VERSION, *, cuda: bool = False, source: Path | None = None) -> Build:
    """The built ``llama-server`` (downloaded and built once, then cached); ``cuda``: with CUDA,
    all the machine's cores building; ``source``: a :func:`pack_source` archive to build from."""
    build = Build(cache_root() / f"llama.cpp-{version}{'-cuda' if cuda else ''}")
    ready = build.home / "ready"
    with _locked(build.home.parent / f"{build.home.name}.lock"):
        if ready.exists() and build.server.exists():
            return build
        missing = [tool for tool in ("cmake", "ninja", "c++", *(("nvcc",) if cuda else ())) if shutil.which(tool) is None]
        if missing:
            raise RuntimeError(f"building llama-server needs {', '.join(missing)} on PATH")
        if build.home.exists():
            shutil.rmtree(build.home)
        build.home.mkdir(parents=True)
        if source is not None:
            unpack_source(source, build.source)
        else:
            with tempfile.TemporaryDirectory(prefix="llama-sdist-", dir=build.home) as scratch:
                pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                       "--no-binary", ":all:", "-d", scratch, *shlex.split(os.environ.get("ENGINE_SUITE_PIP_ARGS", "")),
                       f"llama-cpp-python=={version}"]
                _run(pip, f"downloading the llama-cpp-python {version} source")
                (sdist,) = Path(scratch).glob("*.tar.gz")
                _extract_vendored(sdist, build.source)
        flags, jobs = (CMAKE_FLAGS + CUDA_FLAGS, os.cpu_count() or 1) if cuda else (CMAKE_FLAGS, BUILD_JOBS)
        nice = ["nice", "-n", str(BUILD_NICE)]
        _run([*nice, "cmake", "-S", str(build.source), "-B", str(build.source / "build"), *flags],
             "configuring llama.cpp")
        _run([*nice, "cmake", "--build", str(build.source / "build"), "--target", "llama-server", "-j", str(jobs)],
             "building llama-server")
        if not build.server.exists():
            raise RuntimeError(f"the build did not produce {build.server}")
        ready.write_text(version + "\n")
    return build


def pack_source(build: Build, out: Path) -> Path:
    """``build``'s source tree as a ``.tar.xz`` for :func:`provision` on a machine with no package
    registry: what the server's build and the GGUF converter need (about 7 MB)."""
    skipped = {build.source / part for part in _UNPACKED}

    def keep(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if build.source / member.name in skipped else member

    with tarfile.open(out, "w:xz") as archive:
        for path in sorted(build.source.iterdir()):
            archive.add(path, arcname=path.name, filter=keep)
    return out


def unpack_source(archive: Path, into: Path) -> None:
    """A :func:`pack_source` archive's tree, as ``into``."""
    with tarfile.open(archive) as packed:
        packed.extractall(into, filter="data")


def _extract_vendored(sdist: Path, into: Path) -> None:
    """``vendor/llama.cpp`` of the source distribution, as ``into``."""
    with tarfile.open(sdist) as archive:
        members = []
        for member in archive.getmembers():
            parts = Path(member.name).parts
            if len(parts) > 3 and parts[1:3] == ("vendor", "llama.cpp"):
                member.name = str(Path(*parts[3:]))
                members.append(member)
        if not members:
            raise RuntimeError(f"{sdist.name} has no vendor/llama.cpp")
        archive.extractall(into, members=members, filter="data")


def gguf_model(build: Build, python: Path, model_dir: Path, name: str) -> Path:
    """``model_dir`` (a Hugging Face directory: ``config.json``, safetensors, the tokenizer's
    files) as a GGUF file (weights in f16), converted by ``python`` (it needs torch, transformers
    and numpy; ``gguf-py`` comes from the source), cached by the directory's bytes."""
    digest = hashlib.sha256(build.converter.read_bytes())
    for path in sorted(p for p in model_dir.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    out = cache_root() / "models" / f"{name}-{digest.hexdigest()[:16]}.gguf"
    with _locked(out.parent / f"{out.name}.lock"):
        if not out.exists():
            scratch = out.with_suffix(".partial")
            env = {**os.environ, "PYTHONPATH": str(build.gguf_py), "HF_HUB_OFFLINE": "1",
                   "TRANSFORMERS_OFFLINE": "1"}
            _run([str(python), str(build.converter), str(model_dir), "--outfile", str(scratch), "--outtype", "f16"],
                 f"converting {model_dir.name} to GGUF", env=env)
            scratch.rename(out)
    return out


class LlamaServer:
    """``with LlamaServer(build, model) as server: server.url`` — ``llama-server`` on loopback.

    ``slots``: parallel slots (``--parallel``), each with ``context`` tokens (``--ctx-size`` is
    their sum); prompt caching is on (the server's default, kept explicit with ``--cache-reuse``
    off so that only the exact prefix is reused, as a token log needs); ``--slots`` and
    ``--metrics`` serve the server's own counters; ``nice``: the process's niceness."""

    def __init__(
        self,
        build: Build,
        model: Path,
        *,
        alias: str = "tiny",
        slots: int = 2,
        context: int = 4096,
        threads: int = 2,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 120.0,
        nice: int = 0,
    ) -> None:
        self.build, self.model, self.alias = build, model, alias
        self.slots, self.context, self.threads = slots, context, threads
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.nice = nice
        self.port = 0
        self.log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        argv = [str(self.build.server), "--model", str(self.model), "--alias", self.alias,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--parallel", str(self.slots), "--ctx-size", str(self.context * self.slots),
                "--threads", str(self.threads), "--threads-batch", str(self.threads),
                "--jinja", "--slots", "--metrics", "--no-warmup", *self.extra_args]
        if self.nice:
            argv = ["nice", "-n", str(self.nice), *argv]
        return argv

    def start(self) -> LlamaServer:
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> None:
        """Start ``llama-server`` (the same port on a restart) without waiting; nothing if running."""
        if self.alive:
            return
        self.port = self.port or free_port()
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        assert self._proc is not None, "launch() first"
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self._proc.returncode}:\n{self.tail()}")
            if self.ready():
                return
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"llama-server did not answer within {self.startup_timeout:.0f}s:\n{self.tail()}")

    def ready(self) -> bool:
        """``/health`` answers 200 (503 while the model loads)."""
        try:
            self.get("/health", timeout=2)
        except (OSError, urllib.error.URLError):
            return False
        return True

    def get(self, path: str, *, timeout: float = 10.0) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as answer:
            return json.loads(answer.read().decode() or "null")

    def post(self, path: str, body: Any, *, timeout: float = 60.0) -> Any:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.loads(answer.read().decode())

    def slot_states(self) -> list[dict[str, Any]]:
        """``/slots``: each slot's id, whether it is processing, its cached prompt."""
        return list(self.get("/slots"))

    def cancelled(self) -> int:
        """How many tasks the server cancelled (its log's ``cancel task``: a client that left)."""
        return sum("cancel task" in line for line in self.log.read_text(errors="replace").splitlines())

    def released(self, slot: int) -> list[int]:
        """The slot's releases so far, each as the tokens it held then (prompt and generated)."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            if f"release: id {slot:2d} |" in line and "n_tokens = " in line:
                found.append(int(line.split("n_tokens = ")[1].split(",")[0]))
        return found

    def evaluated(self) -> list[int]:
        """The prompt tokens each task so far had to evaluate (its log's ``prompt eval time``
        line: what its slot's prompt cache did not hold), in order."""
        return [int(n) for n in _PROMPT_EVAL.findall(self.log.read_text(errors="replace"))]

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def _signal(self, signum: int, timeout: float) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def kill(self) -> None:
        """SIGKILL the server: a crash, not a shutdown."""
        self._signal(signal.SIGKILL, 30.0)

    def stop(self) -> None:
        self._signal(signal.SIGTERM, 30.0)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and delete its log."""
        self.stop()
        self.log.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.suite.llamaproc [--pack FILE]``: build (or find) ``llama-server`` and
    print its path; ``--pack``: also write its source as a :func:`pack_source` archive."""
    parser = argparse.ArgumentParser(description=(main.__doc__ or "").splitlines()[0])
    parser.add_argument("--pack", type=Path, help="write the source tree to this .tar.xz")
    args = parser.parse_args(argv)
    started = time.monotonic()
    build = provision()
    print(f"{build.server} ({time.monotonic() - started:.0f}s)")
    if args.pack:
        print(f"{pack_source(build, args.pack)} ({args.pack.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
