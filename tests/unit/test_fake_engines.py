"""The engine fakes behave as the released engines do where adapters go wrong."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx

from responses_cache import get_renderer
from responses_cache.testing import Behaviour, FakeSglang, FakeVllm

ENC = get_renderer("harmony").encoding
TEXT = "<|channel|>final<|message|>Grüße 🚀 done.<|return|>"
RETURN = ENC.encode_single_token("<|return|>")


async def _frames(app: Any, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fake") as client:
        response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


async def test_vllm_completions_stop_id_in_ids_not_in_text_and_usage_last() -> None:
    engine = FakeVllm(ENC, [TEXT])
    engine.default = Behaviour(chunk_tokens=3)
    frames = await _frames(engine.app(), "/v1/completions", {
        "model": "m", "prompt": [1, 2, 3], "stream": True, "stream_options": {"include_usage": True},
        "skip_special_tokens": False, "stop_token_ids": [RETURN], "return_token_ids": True, "max_tokens": 100,
        "retrun_token_ids": True,  # misspelled: ignored silently, as the engine does
    })
    chunks, final = frames[:-1], frames[-1]
    ids = [t for f in chunks for t in f["choices"][0]["token_ids"]]
    text = "".join(f["choices"][0]["text"] for f in chunks)
    assert ids == ENC.encode(TEXT, allowed_special="all") and ids[-1] == RETURN
    assert text == TEXT.removesuffix("<|return|>")
    assert all(len(f["choices"][0]["token_ids"]) <= 3 for f in chunks) and len(chunks[0]["choices"][0]["token_ids"]) == 3
    assert chunks[0]["choices"][0]["prompt_token_ids"] == [1, 2, 3]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["choices"][0]["stop_reason"] == RETURN
    assert final["choices"] == [] and final["usage"]["prompt_tokens"] == 3
    assert engine.unknown_fields == ["/v1/completions:retrun_token_ids"]


async def test_held_back_text_arrives_late_but_complete() -> None:
    engine = FakeVllm(ENC, [TEXT])
    engine.default = Behaviour(chunk_tokens=1, hold_back=True)
    frames = await _frames(engine.app(), "/v1/completions", {
        "model": "m", "prompt": [1], "stream": True, "skip_special_tokens": False, "stop_token_ids": [RETURN]})
    texts = [f["choices"][0]["text"] for f in frames]
    assert texts[0] == "" and "".join(texts) == TEXT.removesuffix("<|return|>")
    assert all("\ufffd" not in t for t in texts)  # split characters are held back, never mangled


async def test_sglang_generate_frames_are_cumulative() -> None:
    engine = FakeSglang(ENC, [TEXT])
    frames = await _frames(engine.app(), "/generate", {
        "input_ids": [1, 2], "stream": True,
        "sampling_params": {"max_new_tokens": 50, "stop_token_ids": [RETURN], "skip_special_tokens": False}})
    ids = [f["output_ids"] for f in frames]
    assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(ids))
    assert ids[-1] == ENC.encode(TEXT, allowed_special="all")
    assert frames[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": RETURN}
    assert frames[-1]["meta_info"]["completion_tokens"] == len(ids[-1])


async def test_error_chunk_abort_and_429() -> None:
    engine = FakeVllm(ENC, [TEXT])
    engine.behaviours = [Behaviour(error_after=1), Behaviour(finish_reason="abort")]
    body = {"model": "m", "token_ids": [1], "stream": True, "sampling_params": {"max_tokens": 50}}
    frames = await _frames(engine.app(), "/inference/v1/generate", body)
    assert "error" in frames[-1] and frames[-1]["error"]["code"] == 500
    frames = await _frames(engine.app(), "/inference/v1/generate", body)
    assert frames[-1]["choices"][0]["finish_reason"] == "abort"
    engine.behaviours = [Behaviour(status=429, retry_after="2")]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=engine.app()), base_url="http://fake") as client:
        limited = await client.post("/inference/v1/generate", json=body)
    assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
