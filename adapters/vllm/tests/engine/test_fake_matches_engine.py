"""The fake vLLM (``responses_cache.testing.fake_engines.FakeVllm``) against the real one, request for
request: every behaviour the adapter tests rely on and a CPU vLLM can show is checked here, so
the fake cannot drift from the engine it stands in for.

"Matches" means: the same HTTP status; every field the fake sends exists in the engine's answer
with a value of the same kind (the engine may send more); and the facts the adapter reads (ids,
finish and stop reasons, usage, cached tokens, error messages) agree."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from engine_suite import KEY, MODEL

from benchmarks.suite.vllmproc import VllmProcess
from responses_cache import get_renderer
from responses_cache.backends.engines import _CONTEXT
from responses_cache.testing import FakeVllm

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

ENC = get_renderer("harmony").encoding
PROMPT = ENC.encode("<|start|>user<|message|>" + "Tell me about the sea. " * 12 + "<|end|><|start|>assistant",
                    allowed_special="all")
STOPS = [ENC.encode_single_token("<|return|>"), ENC.encode_single_token("<|call|>")]
HEADERS = {"Authorization": f"Bearer {KEY}"}


class Pair:
    """The same request to the fake and to the engine."""

    def __init__(self, fake_url: str, engine_url: str) -> None:
        self.urls = {"fake": fake_url, "engine": engine_url}

    def post(self, path: str, body: dict[str, Any]) -> dict[str, httpx.Response]:
        return {name: httpx.post(url + path, json=body, headers=HEADERS, timeout=120) for name, url in self.urls.items()}

    def get(self, path: str) -> dict[str, httpx.Response]:
        return {name: httpx.get(url + path, headers=HEADERS, timeout=30) for name, url in self.urls.items()}

    def stream(self, path: str, body: dict[str, Any]) -> dict[str, list[Any]]:
        """Each side's SSE payloads, in order (``"[DONE]"`` kept as a string)."""
        out: dict[str, list[Any]] = {}
        for name, url in self.urls.items():
            with httpx.stream("POST", url + path, json=body, headers=HEADERS, timeout=120) as response:
                assert response.status_code == 200, (name, response.read())
                lines = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
            out[name] = [line if line == "[DONE]" else json.loads(line) for line in lines]
        return out


def within(engine: Any, fake: Any, where: str = "$") -> None:
    """Every field of ``fake`` is in ``engine`` with a value of the same kind."""
    if isinstance(fake, dict):
        assert isinstance(engine, dict), (where, engine)
        for key, value in fake.items():
            assert key in engine, f"{where}.{key} is sent by the fake, not by the engine: {sorted(engine)}"
            within(engine[key], value, f"{where}.{key}")
    elif isinstance(fake, list):
        assert isinstance(engine, list), (where, engine)
        for a, b in zip(engine, fake, strict=False):
            within(a, b, f"{where}[]")
    elif fake is not None and engine is not None:
        kinds = (bool, int, float, str)
        kind = next((k for k in kinds if isinstance(fake, k)), type(fake))
        assert isinstance(engine, kind) or (kind is float and isinstance(engine, int)), (where, engine, fake)


@pytest.fixture
def pair(engines: dict[str, VllmProcess], responses_cache_server_factory: Callable[..., Any]) -> Callable[[str], Pair]:
    def make(which: str) -> Pair:
        engine = engines[which]
        fake = FakeVllm(ENC, ["<|channel|>final<|message|>Hello there.<|return|>"], model=MODEL,
                        max_model_len=engine.max_model_len, api_key=KEY, scale_out=which == "scale_out")
        return Pair(f"http://127.0.0.1:{responses_cache_server_factory(fake.app()).port}", engine.url)

    return make


def test_a_stock_server_refuses_the_tokens_route_alike(pair: Callable[[str], Pair]) -> None:
    answers = pair("stock").post("/inference/v1/generate", {"token_ids": PROMPT, "sampling_params": {"max_tokens": 4}})
    assert {a.status_code for a in answers.values()} == {403}
    assert answers["fake"].json() == answers["engine"].json()


def test_models_and_tokenize_answer_alike(pair: Callable[[str], Pair]) -> None:
    both = pair("scale_out")
    models = both.get("/v1/models")
    within(models["engine"].json(), models["fake"].json())
    assert models["fake"].json()["data"][0]["max_model_len"] == models["engine"].json()["data"][0]["max_model_len"]
    text = ENC.decode(PROMPT)
    tokenized = both.post("/tokenize", {"model": MODEL, "prompt": text, "add_special_tokens": False})
    within(tokenized["engine"].json(), tokenized["fake"].json())
    assert tokenized["fake"].json()["tokens"] == tokenized["engine"].json()["tokens"] == PROMPT


def test_the_tokens_route_streams_alike(pair: Callable[[str], Pair]) -> None:
    body = {"token_ids": PROMPT, "stream": True, "stream_options": {"include_usage": True}, "cache_salt": "fake-vs-engine",
            "sampling_params": {"max_tokens": 40, "stop_token_ids": STOPS, "skip_special_tokens": False}}
    streams = pair("scale_out").stream("/inference/v1/generate", body)
    for name, frames in streams.items():
        assert frames[-1] == "[DONE]", name
        chunks = [f for f in frames[:-1] if f["choices"]]
        assert all(len(c["choices"][0]["token_ids"]) >= 1 for c in chunks), name
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["choices"][0]["token_ids"][-1] in STOPS
        assert frames[-2]["choices"] == [] and frames[-2]["usage"]["prompt_tokens"] == len(PROMPT), (name, frames[-2])
    within(streams["engine"][0], streams["fake"][0])
    within(streams["engine"][-2], streams["fake"][-2])


def test_completions_with_token_ids_stream_alike(pair: Callable[[str], Pair]) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": 40, "stop_token_ids": STOPS, "skip_special_tokens": False, "return_token_ids": True}
    streams = pair("stock").stream("/v1/completions", body)
    for name, frames in streams.items():
        chunks = [f for f in frames[:-1] if f["choices"]]
        assert chunks[0]["choices"][0]["prompt_token_ids"] == PROMPT, name
        last = chunks[-1]["choices"][0]
        # The stop id: in the ids, out of the text, and named as the stop reason.
        assert last["finish_reason"] == "stop" and last["token_ids"][-1] in STOPS, (name, last)
        assert last["stop_reason"] == last["token_ids"][-1], (name, last)
        assert "<|return|>" not in "".join(c["choices"][0]["text"] for c in chunks), name
    within(streams["engine"][0], streams["fake"][0])
    within(streams["engine"][-2], streams["fake"][-2])


def test_the_prefix_cache_is_partitioned_by_salt_alike(pair: Callable[[str], Pair]) -> None:
    both = pair("scale_out")

    def cached(salt: str) -> dict[str, int]:
        body = {"token_ids": PROMPT, "cache_salt": salt, "stream": True, "stream_options": {"include_usage": True},
                "sampling_params": {"max_tokens": 2}}
        return {name: frames[-2]["usage"]["prompt_tokens_details"]["cached_tokens"]
                for name, frames in both.stream("/inference/v1/generate", body).items()}

    cached("salt-a")
    again, other = cached("salt-a"), cached("salt-b")
    assert again["fake"] > 0 and again["engine"] > 0, again
    assert other == {"fake": 0, "engine": 0}, other


TOO_LONG = PROMPT * (4096 // len(PROMPT) + 1)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/inference/v1/generate", {"token_ids": TOO_LONG, "stream": True, "sampling_params": {"max_tokens": 4}}),
        ("/v1/completions", {"model": MODEL, "prompt": TOO_LONG, "stream": True, "max_tokens": 4}),
        ("/inference/v1/generate", {"token_ids": PROMPT, "stream_options": {"include_usage": True},
                                    "sampling_params": {"max_tokens": 4}}),
        ("/v1/completions", {"model": MODEL, "prompt": PROMPT, "stream_options": {"include_usage": True},
                             "max_tokens": 4}),
    ],
    ids=["generate-over-the-window", "completions-over-the-window", "generate-stream-options-alone",
         "completions-stream-options-alone"],
)
def test_bad_requests_are_answered_alike(pair: Callable[[str], Pair], path: str, body: dict[str, Any]) -> None:
    answers = pair("scale_out").post(path, body)
    status = {name: a.status_code for name, a in answers.items()}
    assert status["fake"] == status["engine"], (status, answers["engine"].text[:300])
    payloads = {name: _payload(a) for name, a in answers.items()}
    within(payloads["engine"], payloads["fake"])
    if len(body.get("token_ids") or body.get("prompt") or ()) > 4096:
        # The adapter maps it by its words, wherever it comes (a 400, or an error chunk).
        assert all(_CONTEXT.search(p["error"]["message"]) for p in payloads.values()), payloads


def _payload(answer: httpx.Response) -> Any:
    """A JSON answer, or a stream's first payload."""
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        first = next(line for line in answer.text.splitlines() if line.startswith("data: "))
        return json.loads(first[len("data: "):])
    return answer.json()
