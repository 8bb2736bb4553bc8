"""The real Codex CLI completes a shell-command task through the simulated engine over WebSocket.

The CLI comes from the npm registry (``@openai/codex``, pinned) and is cached under
``~/.cache/responses-cache/codex``. The test is skipped only where Node.js/npm is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.codex_cli import codex_binary, codex_exec

pytestmark = [pytest.mark.npm, pytest.mark.subprocess, pytest.mark.slow]


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    return codex_binary()


@pytest.mark.parametrize("renderer", ["harmony", "hf:qwen3"])
def test_codex_exec_runs_a_shell_command_over_websocket(
    codex_bin: Path, responses_cache_server_factory: Any, tmp_path: Path, renderer: str
) -> None:
    """On the default renderer, and on a real model's own template and tokenizer (Qwen3's
    published files, the ``hf`` renderer): Codex's instructions, developer and environment
    messages, tool set and reasoning items go through that template, and the simulated engine
    answers in Qwen's format. (Of the other real templates the tests fetch, Qwen2.5's serves Codex
    too; the others cannot: Mistral Nemo's and Gemma 3's refuse a developer message followed by
    user messages, and the Llama 3, 3.1 and DeepSeek-V3 ones in those packages write no tool
    definitions -- see docs/codex.md.)"""
    from responses_cache.backends.simulated import SimulatedConfig, SimulatedEngine
    from responses_cache.edge.app import DEFAULT_CONTEXT_WINDOW, default_router

    if renderer.startswith("hf:"):
        from tests.tokens.hf_assets import require_real_model

        renderer = f"hf:{require_real_model(renderer[3:])}"
    router = default_router(SimulatedEngine(SimulatedConfig(instant=True)), renderer, DEFAULT_CONTEXT_WINDOW)
    route = router.resolve("sim-1", "")
    server = responses_cache_server_factory(router=router)
    done = codex_exec(codex_bin, server.http_url, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hello-from-codex" in done.stdout
    assert "Falling back" not in done.stderr
    metrics = server.app.state.metrics
    assert metrics.total("responses_completed_total", transport="websocket") >= 3  # warm-up, call, answer
    assert metrics.total("responses_completed_total", transport="http") == 0
    assert metrics.total("warmups_total", transport="websocket") == 1
    assert metrics.total("cache_hits_total", transport="websocket") >= 2
    stats = route.renderer.stats
    assert stats.items_rendered > 0 and stats.rewinds == 0, stats
