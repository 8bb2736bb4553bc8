"""The SDK's WebSocket tool loop over each model family's own template (the ``hf`` renderer):
the simulated engine samples its replies in the family's format (reasoning, tool calls, answers),
the renderer's parser reads them back, and every frame is validated strictly."""

from __future__ import annotations

import itertools
import pathlib
from typing import Any

import pytest
from openai import OpenAI
from test_sdk import TURNS, Loop, engine

from tests.tokens.hf_assets import build_tokenizer_dir, require_real_model

pytest.importorskip("tokenizers")


class FamilyLoop(Loop):
    """The shared loop's checks, with each turn's reasoning items counted and set aside."""

    reasoning = 0

    def next_request(self, final: Any) -> dict[str, Any] | None:
        output = final.response.output
        self.reasoning += sum(item.type == "reasoning" for item in output)
        assert [item.type for item in output if item.type == "reasoning"] == [item.type for item in output[:1] if item.type == "reasoning"]
        final.response.output = [item for item in output if item.type != "reasoning"]
        return super().next_request(final)


REAL = {"real:qwen3": "qwen3", "real:mistral-nemo": "mistral-nemo"}


@pytest.mark.parametrize(
    "family", ["qwen", "llama3", "deepseek", "mistral", *(pytest.param(f, marks=pytest.mark.npm) for f in REAL)]
)
def test_sdk_tool_loop_in_each_family_format(responses_cache_server_factory: Any, tmp_path: pathlib.Path, family: str) -> None:
    """Also over two real models' published files: Qwen3's, and Mistral Nemo's, whose template
    refuses any call id but nine letters and digits (the ids the server makes in that format)."""
    model = require_real_model(REAL[family]) if family in REAL else build_tokenizer_dir(family, tmp_path / family)
    backend = engine()
    server = responses_cache_server_factory(backend=backend, renderer=f"hf:{model}")
    client = OpenAI(base_url=server.http_url, api_key="sk-local", max_retries=0)
    loop = FamilyLoop(stream_id=None)
    with client, client.responses.connect() as conn:
        loop.run(conn)
    assert len(loop.responses) == TURNS
    assert server.app.state.metrics.total("cache_hits_total") == TURNS - 1
    # Qwen's template shows the reasoning of the current turn; the others leave it out
    assert (loop.reasoning == TURNS) if "qwen" in family else (loop.reasoning == 0)
    cached = [r.usage.input_tokens_details.cached_tokens for r in loop.responses]
    assert all(b > a for a, b in itertools.pairwise(cached[1:])), cached
