"""``docs/llamacpp.md`` followed word for word: its ``serve.toml`` (the model file and the server's
URL made this suite's) started with ``responses-cache serve``, and its Codex configuration used by
the real Codex CLI against it. The tiny model's answers are noise: each is capped at 8 tokens with
the page's own commented ``extra_body`` line."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from llama_suite import Family, sdk, turn

import responses_cache
from responses_cache.testing import free_port
from tests.codex_cli import codex_binary

pytestmark = [pytest.mark.engine, pytest.mark.subprocess, pytest.mark.timeout(900)]  # a first run builds llama-server

PAGE = pathlib.Path(__file__).resolve().parents[4] / "docs" / "llamacpp.md"
MODEL_FILE = "~/models/Qwen3-8B-Q4_K_M.gguf"


def block(starts: str) -> str:
    """The page's fenced ``toml`` block whose first line is ``starts``."""
    for found in re.findall(r"```toml\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL):
        if found.startswith(starts):
            return str(found)
    raise AssertionError(f"docs/llamacpp.md has no toml block starting with {starts!r}")


def _cli() -> str:
    """The module of the ``responses-cache`` command in the package under test."""
    package = pathlib.Path(responses_cache.__file__).parent
    return "responses_cache.server.cli" if (package / "server" / "cli.py").is_file() else "responses_cache.cli"


@contextlib.contextmanager
def serving(qwen: Family, tmp_path: pathlib.Path) -> Iterator[str]:
    """``responses-cache serve --config serve.toml`` with the page's file; its base URL (…/v1)."""
    port = free_port()
    config = block("# serve.toml")
    assert MODEL_FILE in config and "http://127.0.0.1:8080" in config and "port = 8000" in config
    config = (config.replace(MODEL_FILE, str(qwen.gguf)).replace("http://127.0.0.1:8080", qwen.server.url)
              .replace("port = 8000", f"port = {port}")
              .replace("# extra_body = { n_predict = 4096 }", "extra_body = { n_predict = 8 }"))
    (tmp_path / "serve.toml").write_text(config)
    proc = subprocess.Popen([sys.executable, "-m", _cli(), "serve", "--config", str(tmp_path / "serve.toml")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "responses-cache serve did not start"
                time.sleep(0.2)
        yield url + "/v1"
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_pages_serve_settings_and_codex_configuration_work(qwen: Family, tmp_path: pathlib.Path) -> None:
    with serving(qwen, tmp_path) as base_url:
        # The SDK over WebSocket mode: a continuation reuses the conversation's tokens.
        with sdk(base_url) as client, client.responses.connect() as conn:
            first = turn(conn, model="local", input="Hello there.")
            second = turn(conn, model="local", input="And then?", previous_response_id=first["id"])
        assert second["usage"]["input_tokens_details"]["cached_tokens"] >= first["usage"]["input_tokens"]
        # The Codex CLI with the page's configuration (its base_url made this server's).
        codex = codex_binary()
        home, work = tmp_path / "codex-home", tmp_path / "work"
        home.mkdir()
        work.mkdir()
        config = block("# $CODEX_HOME/config.toml")
        assert "http://127.0.0.1:8000/v1" in config
        (home / "config.toml").write_text(config.replace("http://127.0.0.1:8000/v1", base_url))
        done = subprocess.run([str(codex), "exec", "--skip-git-repo-check", "--ephemeral", "Run `ls` and tell me what is here."],
                              cwd=work, env={"PATH": os.environ["PATH"], "CODEX_HOME": str(home), "HOME": str(tmp_path)},
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
        # Codex took the answer: noise that ended by itself, or cut at 8 tokens (which it reports).
        assert done.returncode == 0 or "max_output_tokens" in done.stdout + done.stderr, done.stderr[-3000:]
