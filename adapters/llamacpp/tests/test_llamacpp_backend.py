"""The llama.cpp backend against a fake ``llama-server`` (an httpx transport following the real
server's ``/completion`` stream, ``/props``, ``/tokenize`` and error bodies, as the real-engine
suite sees them), its slot table, and the entry point. The real server: ``tests/engine``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from responses_cache_llamacpp import HandshakeError, LlamaCppBackend, SlotTable, make_backend
from websockets.sync.client import connect

from responses_cache import create_app, get_renderer
from responses_cache.testing import start_once

CHATML = get_renderer("chatml")
ENC = CHATML.encoding
END = CHATML.decode(list(CHATML.sampling_stop_tokens))  # <|im_end|>


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


class FakeLlamaServer:
    """``llama-server`` as the backend sees it: each slot keeps its last prompt and answer (all but
    the last sampled token, as the real one), and reports the common prefix as ``cache_n``."""

    def __init__(self, answers: list[str], *, slots: int = 2, n_ctx: int = 4096, eog: frozenset[int] | None = None,
                 status: int = 200) -> None:
        self.answers, self.n_ctx, self.status = answers, n_ctx, status
        self.eog = frozenset(CHATML.sampling_stop_tokens) if eog is None else eog
        self.cache: list[list[int]] = [[] for _ in range(slots)]
        self.requests: list[dict[str, Any]] = []
        self.total_slots = slots

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if path == "/props":
            return httpx.Response(200, json={"default_generation_settings": {"n_ctx": self.n_ctx},
                                             "total_slots": self.total_slots})
        body = json.loads(request.content)
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": ENC.encode(body["content"], allowed_special="all")})
        assert path == "/completion", path
        self.requests.append(body)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"code": self.status, "message": "Loading model",
                                                               "type": "unavailable_error"}})
        prompt: list[int] = body["prompt"]
        if len(prompt) >= self.n_ctx:
            return httpx.Response(400, json={"error": {
                "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": len(prompt), "n_ctx": self.n_ctx,
                "message": f"request ({len(prompt)} tokens) exceeds the available context size ({self.n_ctx} tokens), try increasing it"}})
        slot = body["id_slot"]
        cached = min(_common(self.cache[slot], prompt), len(prompt) - 1)
        out: list[int] = []
        stop_type = "limit"
        for token in ENC.encode(self.answers.pop(0), allowed_special="all"):
            if len(out) == body["n_predict"]:
                break
            out.append(token)
            if token in self.eog:
                stop_type = "eos"
                break
        self.cache[slot] = prompt + out[:-1]
        chunks = [{"index": 0, "content": ENC.decode([t]), "tokens": [t], "stop": False, "id_slot": -1} for t in out]
        chunks.append({"index": 0, "content": "", "tokens": [], "id_slot": slot, "stop": True, "stop_type": stop_type,
                       "tokens_cached": len(prompt) + len(out) - 1,
                       "timings": {"cache_n": cached, "prompt_n": len(prompt) - cached, "predicted_n": len(out)}})
        sse = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=sse.encode())


def _backend(*fakes: FakeLlamaServer, **options: Any) -> LlamaCppBackend:
    urls = [f"http://llama-{n}" for n in range(len(fakes))]
    by_host = {f"llama-{n}": fake for n, fake in enumerate(fakes)}
    transport = httpx.MockTransport(lambda request: by_host[request.url.host](request))
    return LlamaCppBackend(urls, model="local", transport=transport, **options)


def _turn(ws: Any, **body: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", "model": "local", "store": False, **body}))
    while (event := json.loads(ws.recv(timeout=30)))["type"] not in (
        "response.completed", "response.failed", "response.incomplete", "error"
    ):
        pass
    return dict(event)


def test_turns_go_as_token_ids_to_the_conversations_slot(responses_cache_server_factory: Any) -> None:
    fake = FakeLlamaServer([f"Hello there.{END}", f"Again.{END}", f"Other.{END}", "no end in sight"])
    server = responses_cache_server_factory(create_app(backend=_backend(fake, template="chatml"), renderer="chatml"))
    with connect(server.ws_url) as a, connect(server.ws_url) as b:
        first = _turn(a, input="Hi!", max_output_tokens=50, temperature=0.5)
        second = _turn(a, input="And?", previous_response_id=first["response"]["id"])
        other = _turn(b, input="Someone else.")
        cut = _turn(b, input="Go on.", previous_response_id=other["response"]["id"], max_output_tokens=3)
    one, two, three, four = fake.requests
    assert {k: one[k] for k in ("stream", "cache_prompt", "return_tokens", "n_predict", "temperature")} == {
        "stream": True, "cache_prompt": True, "return_tokens": True, "n_predict": 50, "temperature": 0.5}
    assert "top_p" not in one and two["n_predict"] == 4096 - len(two["prompt"])  # no limit: what the slot leaves
    # One slot per conversation; the continuation extends the prompt by exactly the sampled ids.
    assert one["id_slot"] == two["id_slot"] != three["id_slot"] == four["id_slot"]
    sampled = ENC.encode(f"Hello there.{END}", allowed_special="all")
    assert two["prompt"][: len(one["prompt"]) + len(sampled)] == one["prompt"] + sampled
    assert first["response"]["output"][0]["content"][0]["text"] == "Hello there."
    assert second["type"] == "response.completed"
    usage = second["response"]["usage"]
    assert usage["input_tokens"] == len(two["prompt"]) and usage["input_tokens_details"]["cached_tokens"] > len(one["prompt"])
    # n_predict reached: stop_type "limit" is max_output_tokens.
    assert cut["type"] == "response.incomplete" and cut["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut["response"]["usage"]["output_tokens"] == 3


def test_a_stop_id_the_server_goes_on_after_ends_the_answer(responses_cache_server_factory: Any) -> None:
    fake = FakeLlamaServer([f"Done.{END} and then some noise"], eog=frozenset())
    server = responses_cache_server_factory(create_app(backend=_backend(fake), renderer="chatml"))
    with connect(server.ws_url) as ws:
        done = _turn(ws, input="Hi!")
    assert done["type"] == "response.completed", done
    assert done["response"]["output"][0]["content"][0]["text"] == "Done."


def test_a_prompt_over_the_context_is_refused_before_the_response_exists(responses_cache_server_factory: Any) -> None:
    # By the slot's context read from /props, and (a larger one configured) by the server's own check.
    for options in ({}, {"context_window": 100_000}):
        fake = FakeLlamaServer([f"Short.{END}"], n_ctx=64)
        server = responses_cache_server_factory(create_app(backend=_backend(fake, **options), renderer="chatml"))
        with connect(server.ws_url) as ws:
            ws.send(json.dumps({"type": "response.create", "model": "local", "input": "lorem " * 200}))
            event = json.loads(ws.recv(timeout=30))
            assert event["type"] == "error" and event["status"] == 400, event
            assert event["error"]["code"] == "context_length_exceeded", event
            assert _turn(ws, input="ok")["type"] == "response.completed"
        assert len(fake.requests) == (0 if not options else 1) + 1


def test_an_unavailable_server_sends_the_conversation_to_the_next(responses_cache_server_factory: Any) -> None:
    loading, ready = FakeLlamaServer([], status=503), FakeLlamaServer([f"Here.{END}"] * 2)
    backend = _backend(loading, ready)
    server = responses_cache_server_factory(create_app(backend=backend, renderer="chatml"))
    with connect(server.ws_url) as ws:
        done = _turn(ws, input="Hi!")
    assert done["type"] == "response.completed", done
    assert len(ready.requests) == 1


def test_the_handshake_refuses_a_server_with_another_vocabulary() -> None:
    start_once(_backend(FakeLlamaServer([]), template="chatml"))
    with pytest.raises(HandshakeError, match="tokenizes differently"):
        start_once(_backend(FakeLlamaServer([]), template="harmony"))


def test_the_slot_table_keeps_recent_conversations_and_never_evicts_a_running_one() -> None:
    table = SlotTable(2)
    a, b = table.acquire("a"), table.acquire("b")
    assert a != b and table.acquire("a") == a  # a is running twice now, and the most recent
    table.release(b)
    assert table.acquire("c") == b  # b was idle and least recent: c takes its slot
    table.release(b)
    table.release(a)
    assert table.acquire("b") == b  # a still runs once: c, idle, gives its slot
    table.release(a)
    table.release(b)
    assert table.acquire("d") == a  # a, idle now and least recent, gives its slot
    assert table.slot_of("a") is None and table.slot_of("c") is None and table.slot_of("b") == b


def test_the_entry_point_and_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["responses_cache.backends"] == {
        "llamacpp": "responses_cache_llamacpp:make_backend"}
    monkeypatch.setenv("LLAMACPP_BASE_URL", "http://a:1,http://b:2")
    monkeypatch.setenv("LLAMACPP_MODEL", "qwen")
    backend = make_backend()
    assert backend.replicas.urls == ["http://a:1", "http://b:2"] and list(backend.models()) == ["qwen"]
