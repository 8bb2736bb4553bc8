"""The real Codex CLI, for the tests that drive it: installed from the npm registry (``@openai/codex``,
pinned) into ``~/.cache/responses-cache/codex-<version>`` (or ``$CODEX_BIN``), and run against a
server with the provider configuration users copy (``examples/codex/config.toml``)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CODEX_VERSION = "0.171.0"
CONFIG = Path(__file__).resolve().parents[1] / "examples" / "codex" / "config.toml"
TASK = "Run `echo hello-from-codex` and tell me the output."


def codex_binary() -> Path:
    """The CLI, installed on first use; the calling test is skipped where npm is missing."""
    explicit = os.environ.get("CODEX_BIN")
    if explicit:
        return Path(explicit)
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install the Codex CLI")
    prefix = Path.home() / ".cache" / "responses-cache" / f"codex-{CODEX_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "codex"
    if not binary.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        with open(prefix.parent / f"{prefix.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time (parallel workers, runs)
            if not binary.exists():
                subprocess.run(
                    ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix),
                     f"@openai/codex@{CODEX_VERSION}"],
                    check=True, timeout=600, stdin=subprocess.DEVNULL,
                )
    return binary


def codex_environment(binary: Path, base_url: str, tmp_path: Path, *, model: str | None = None, task: str = TASK,
                      api_key: str | None = None) -> tuple[list[str], Path, dict[str, str]]:
    """The command line, working directory and environment of ``codex exec`` of ``task`` against
    the server at ``base_url`` (``…/v1``) over WebSocket mode, in a throwaway home and working
    directory under ``tmp_path``."""
    home = tmp_path / "codex-home"
    home.mkdir()
    config = CONFIG.read_text().replace("http://127.0.0.1:8000/v1", base_url)
    if model is not None:
        config = config.replace('model = "sim-1"', f'model = "{model}"')
    if api_key is not None:
        assert '# env_key = "RESPONSES_CACHE_API_KEY"' in config, "the example's commented key line moved"
        config = config.replace('# env_key = "RESPONSES_CACHE_API_KEY"', 'env_key = "RESPONSES_CACHE_API_KEY"')
    (home / "config.toml").write_text(config)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": os.environ["PATH"], "CODEX_HOME": str(home), "HOME": str(tmp_path)}
    if api_key is not None:
        env["RESPONSES_CACHE_API_KEY"] = api_key
    return [str(binary), "exec", "--skip-git-repo-check", "--ephemeral", task], work, env


def codex_exec(binary: Path, base_url: str, tmp_path: Path, *, model: str | None = None, task: str = TASK,
               api_key: str | None = None) -> subprocess.CompletedProcess[str]:
    """``codex exec`` of ``task`` against the server at ``base_url`` (``…/v1``), to its end."""
    argv, work, env = codex_environment(binary, base_url, tmp_path, model=model, task=task, api_key=api_key)
    return subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=180)


def start_codex(binary: Path, base_url: str, tmp_path: Path, task: str, *, api_key: str | None = None
                ) -> subprocess.Popen[str]:
    """``codex exec`` of ``task`` in the background (as :func:`codex_exec` runs it), its output
    piped: for a test that acts on the server while Codex works."""
    argv, cwd, env = codex_environment(binary, base_url, tmp_path, task=task, api_key=api_key)
    return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def running(command: str) -> bool:
    """A process on this machine is running ``command`` (Codex runs a task's command under a shell)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if command in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                return True
        except OSError:
            continue
    return False
