"""The real Codex CLI through the llama.cpp adapter to a real ``llama-server``, with the GGUF's own
template and tokenizer (``gguf:``): the prompt of Codex's turn (its instructions, developer and
environment messages, its tool set) equals the server's own ``/apply-template`` then
``/tokenize`` of the same messages and tools. The tiny model's answer is noise, cut at 8 tokens
(an operator's ``n_predict`` in ``extra_body``: Codex sets no ``max_output_tokens``)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from llama_suite import KEY, Family, Recorder

from responses_cache import Route, StaticRouter, create_app
from responses_cache.testing import RecordingBackend
from tests.codex_cli import codex_binary, codex_exec

pytestmark = [pytest.mark.engine, pytest.mark.npm, pytest.mark.timeout(900)]  # a first run builds llama-server


def test_codex_prompts_equal_the_servers_own(
    qwen: Family, responses_cache_server_factory: Callable[..., Any], tmp_path: pathlib.Path
) -> None:
    codex = codex_binary()
    recorder = Recorder()
    backend = RecordingBackend(qwen.backend(transport=recorder, extra_body={"n_predict": 8}))
    route = Route(name="default", model=qwen.name, backend=backend, renderer=qwen.renderer)
    server = responses_cache_server_factory(
        create_app(backend=backend, router=StaticRouter({qwen.name: route}, default=route), api_keys=[KEY]))
    done = codex_exec(codex, server.http_url, tmp_path, model=qwen.name, api_key=KEY)
    assert backend.requests, done.stderr[-3000:]
    prompts = []
    for n, request in enumerate(backend.requests):
        assert request.prompt is not None and request.tools.tools, "Codex sends its tool set"
        prompts.append(list(request.prompt.tokens()))
        expected = qwen.rendering(request.instructions, request.tools, request.conversation.items())
        assert prompts[-1] == expected, (n, qwen.renderer.decode(prompts[-1])[-2000:], qwen.renderer.decode(expected)[-2000:])
    assert recorder.prompts == prompts
    metrics = server.app.state.metrics
    assert metrics.total("responses_completed_total", transport="http") == 0  # WebSocket mode only
    # Codex took the answer: noise that ended by itself, or cut at 8 tokens (which it reports).
    assert done.returncode == 0 or "max_output_tokens" in done.stdout + done.stderr, done.stderr[-3000:]
