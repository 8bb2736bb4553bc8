"""The real Codex CLI completes a shell-command task through the simulated engine over WebSocket.

The CLI comes from the npm registry (``@openai/codex``, pinned) and is cached under
``~/.cache/responses-cache/codex``. The test is skipped only where Node.js/npm is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.npm, pytest.mark.subprocess, pytest.mark.slow]

CODEX_VERSION = "0.171.0"
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "codex" / "config.toml"


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    explicit = os.environ.get("CODEX_BIN")
    if explicit:
        return Path(explicit)
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install the Codex CLI")
    prefix = Path.home() / ".cache" / "responses-cache" / f"codex-{CODEX_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "codex"
    if not binary.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), f"@openai/codex@{CODEX_VERSION}"],
            check=True, timeout=600, stdin=subprocess.DEVNULL,
        )
    return binary


def test_codex_exec_runs_a_shell_command_over_websocket(codex_bin: Path, responses_cache_server_factory: Any, tmp_path: Path) -> None:
    server = responses_cache_server_factory()
    home = tmp_path / "codex-home"
    home.mkdir()
    config = CONFIG.read_text().replace("http://127.0.0.1:8000/v1", server.http_url)
    (home / "config.toml").write_text(config)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": os.environ["PATH"], "CODEX_HOME": str(home), "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(codex_bin), "exec", "--skip-git-repo-check", "--ephemeral", "Run `echo hello-from-codex` and tell me the output."],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hello-from-codex" in done.stdout
    assert "Falling back" not in done.stderr
    metrics = server.app.state.metrics
    assert metrics.total("responses_completed_total", transport="websocket") >= 3  # warm-up, call, answer
    assert metrics.total("responses_completed_total", transport="http") == 0
    assert metrics.total("warmups_total", transport="websocket") == 1
    assert metrics.total("cache_hits_total", transport="websocket") >= 2
