"""The JSON the engine adapters send and read (``responses_cache.engines``): a request body the
engine parses as it would ``json=``'s, every streamed chunk read, a malformed one a clear error."""

from __future__ import annotations

import json
import math

import pytest

from responses_cache import BackendError
from responses_cache.engines import JSON_CONTENT_TYPE, json_body, json_chunk


def test_a_body_is_the_json_the_engine_would_get_from_httpx() -> None:
    body = {"token_ids": list(range(30_000)), "sampling_params": {"temperature": 0.0, "max_tokens": 16},
            "stream": True, "text": "naïve \u2028 \"quoted\"", "stop": None}
    assert json.loads(json_body(body)) == body
    assert JSON_CONTENT_TYPE == {"Content-Type": "application/json"}


def test_a_chunk_is_read() -> None:
    assert json_chunk('{"choices": [{"token_ids": [1, 2], "finish_reason": null}]}', "vLLM") == {
        "choices": [{"token_ids": [1, 2], "finish_reason": None}]
    }


def test_what_only_the_standard_library_reads_is_read_too() -> None:
    chunk = json_chunk('{"logprob": NaN, "other": -Infinity}', "vLLM")
    assert math.isnan(chunk["logprob"]) and chunk["other"] == -math.inf


@pytest.mark.parametrize("data", ["{", "not json", '{"a": 1} trailing'])
def test_a_malformed_chunk_is_a_server_error_naming_the_engine(data: str) -> None:
    with pytest.raises(BackendError) as raised:
        json_chunk(data, "llama-server")
    assert raised.value.code == "server_error"
    assert "llama-server sent a malformed chunk" in str(raised.value)
