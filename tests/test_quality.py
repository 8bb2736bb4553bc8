"""Standing checks that run with the suite: ruff, mypy --strict and the import-linter layering."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "command",
    [
        [str(BIN / "ruff"), "check", "responses_cache", "tests", "examples", "benchmarks", "adapters"],
        [str(BIN / "mypy"), "-p", "responses_cache", "-p", "benchmarks.suite"],
        [str(BIN / "mypy"), "adapters/vllm/responses_cache_vllm"],
        [str(BIN / "mypy"), "adapters/cerebras/responses_cache_cerebras"],
        [str(BIN / "mypy"), "adapters/llamacpp/responses_cache_llamacpp"],
        [str(BIN / "lint-imports")],
    ],
    ids=["ruff", "mypy", "mypy-adapters", "mypy-cerebras", "mypy-llamacpp", "import-linter"],
)
def test_tool_is_clean(command: list[str]) -> None:
    # mypy's incremental cache outside the checkout, so that a fresh clone (CI's) re-checks only
    # what changed since the last run on this machine (mypy checks each cached module's hash).
    env = {**os.environ, "MYPY_CACHE_DIR": str(Path.home() / ".cache" / "responses-cache" / "mypy")}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
