"""WebSocket mode inside vLLM's server: the middleware added the way ``vllm serve --middleware``
adds it (``app.add_middleware(cls)``, no arguments), in front of a fake vLLM ASGI app, with the
generation called in-process."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from responses_cache_vllm.middleware import MiddlewareSettings, ResponsesCacheMiddleware
from starlette.applications import Starlette
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from responses_cache import get_renderer
from responses_cache.testing import Behaviour, FakeVllm

ENC = get_renderer("harmony").encoding
ANSWER = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hello there.<|return|>"


def _vllm_with_middleware(engine: FakeVllm, monkeypatch: pytest.MonkeyPatch, **env: str) -> Starlette:
    monkeypatch.setenv("RESPONSES_CACHE_MODEL", engine.model)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    app = engine.app()
    app.add_middleware(ResponsesCacheMiddleware)  # type: ignore[arg-type]  # what vLLM's register does
    return app


def _turn(ws: Any, **body: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", "model": "openai/gpt-oss-20b", **body}))
    while (event := json.loads(ws.recv(timeout=30)))["type"] not in ("response.completed", "response.failed", "error"):
        pass
    return dict(event)


def test_websocket_mode_inside_vllm_calls_generate_in_process(
    responses_cache_server_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeVllm(ENC, [ANSWER, ANSWER], api_key="sk-vllm")
    server = responses_cache_server_factory(_vllm_with_middleware(engine, monkeypatch, VLLM_API_KEY="sk-vllm"))
    headers = {"Authorization": "Bearer sk-vllm"}
    with connect(server.ws_url, additional_headers=headers) as ws:
        first = _turn(ws, input="hi", store=False)
        second = _turn(ws, input="again", store=False, previous_response_id=first["response"]["id"])
    assert first["response"]["output"][-1]["content"][0]["text"] == "Hello there."
    assert second["type"] == "response.completed"
    calls = engine.generation_requests()
    assert [c.path for c in calls] == ["/inference/v1/generate"] * 2
    # vLLM's key travels on the in-process call; the continuation extends the first prompt.
    assert all(c.headers["authorization"] == "Bearer sk-vllm" for c in calls)
    one, two = calls[0].body["token_ids"], calls[1].body["token_ids"]
    assert two[: len(one)] == one and engine.unknown_fields == []
    # Everything else is vLLM's, untouched (its own key check included).
    assert httpx.get(f"http://127.0.0.1:{server.port}/v1/models", headers=headers).json()["data"][0]["id"] == engine.model
    assert httpx.get(f"http://127.0.0.1:{server.port}/v1/models").status_code == 401


def test_the_middleware_on_a_stock_vllm_generates_through_completions(
    responses_cache_server_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `vllm serve --middleware …` without --enable-scale-out: the tokens-in route answers 403.
    engine = FakeVllm(ENC, [ANSWER, ANSWER], scale_out=False)
    server = responses_cache_server_factory(_vllm_with_middleware(engine, monkeypatch))
    with connect(server.ws_url) as ws:
        first = _turn(ws, input="hi", store=False)
        second = _turn(ws, input="again", store=False, previous_response_id=first["response"]["id"])
    assert second["type"] == "response.completed", second
    assert [c.path for c in engine.generation_requests()] == ["/v1/completions"] * 2


def test_the_middleware_checks_vllms_api_key(responses_cache_server_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeVllm(ENC, [ANSWER], api_key="sk-vllm")
    server = responses_cache_server_factory(_vllm_with_middleware(engine, monkeypatch, VLLM_API_KEY="sk-vllm"))
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(InvalidStatus) as refused:
            connect(server.ws_url, additional_headers=headers).close()
        assert refused.value.response.status_code == 401
    assert engine.requests == []


def test_a_client_leaving_aborts_the_in_process_generation(
    responses_cache_server_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeVllm(ENC, [ANSWER])
    engine.default = Behaviour(chunk_tokens=1, hang_after=6)
    server = responses_cache_server_factory(_vllm_with_middleware(engine, monkeypatch))
    with connect(server.ws_url) as ws:
        ws.send(json.dumps({"type": "response.create", "model": engine.model, "input": "hi"}))
        while json.loads(ws.recv(timeout=30))["type"] != "response.reasoning_text.delta":
            pass
    deadline = time.monotonic() + 10
    while engine.closed_early == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.closed_early == 1


def test_the_middleware_needs_the_model_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RESPONSES_CACHE_MODEL", raising=False)
    with pytest.raises(ValueError, match="RESPONSES_CACHE_MODEL"):
        ResponsesCacheMiddleware(Starlette())  # type: ignore[arg-type]


# -- logging: the package's records in vLLM's log ----------------------------------------------


@pytest.fixture
def vllm_logging() -> Iterator[io.StringIO]:
    """vLLM's logging as ``vllm serve`` configures it (a handler on the ``vllm`` logger only, at
    INFO; the root logger dropping what is under ERROR); every logger restored afterwards."""
    ours, theirs, root = logging.getLogger("responses_cache"), logging.getLogger("vllm"), logging.getLogger()
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in (ours, theirs, root)]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("VLLM-FORMAT %(levelname)s %(message)s"))
    theirs.handlers[:] = [handler]
    theirs.setLevel(logging.INFO)
    ours.handlers[:] = []
    ours.setLevel(logging.NOTSET)
    root.setLevel(logging.ERROR)
    try:
        yield stream
    finally:
        for lg, handlers, level, propagate in saved:
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate


def test_the_packages_records_go_to_vllms_log(vllm_logging: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESPONSES_CACHE_MODEL", "m")
    monkeypatch.delenv("RESPONSES_CACHE_LOG_LEVEL", raising=False)
    ResponsesCacheMiddleware(Starlette())  # type: ignore[arg-type]
    ResponsesCacheMiddleware(Starlette())  # a second middleware in the process adds nothing twice
    logging.getLogger("responses_cache.lifecycle").warning("drain deadline passed")
    logging.getLogger("responses_cache.turns").info("turn resp_1 completed")
    logging.getLogger("responses_cache.turns").debug("not at vLLM's level")
    assert vllm_logging.getvalue().splitlines() == [
        "VLLM-FORMAT WARNING drain deadline passed",
        "VLLM-FORMAT INFO turn resp_1 completed",
    ]


def test_the_log_level_can_be_set_apart_from_vllms(vllm_logging: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESPONSES_CACHE_MODEL", "m")
    monkeypatch.setenv("RESPONSES_CACHE_LOG_LEVEL", "warning")
    ResponsesCacheMiddleware(Starlette())  # type: ignore[arg-type]
    logging.getLogger("responses_cache.turns").info("turn resp_1 completed")
    logging.getLogger("responses_cache.turns").warning("turn resp_2 failed")
    assert vllm_logging.getvalue().splitlines() == ["VLLM-FORMAT WARNING turn resp_2 failed"]


def test_a_logging_configuration_of_the_users_is_left_alone(vllm_logging: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESPONSES_CACHE_MODEL", "m")
    mine = io.StringIO()
    logging.getLogger("responses_cache").addHandler(logging.StreamHandler(mine))
    ResponsesCacheMiddleware(Starlette())  # type: ignore[arg-type]
    logging.getLogger("responses_cache.lifecycle").error("closing failed")
    assert mine.getvalue() == "closing failed\n"
    assert vllm_logging.getvalue() == ""
    # vLLM's logging off (``VLLM_CONFIGURE_LOGGING=0``: no handler on its logger): nothing added.
    logging.getLogger("responses_cache").handlers[:] = []
    logging.getLogger("vllm").handlers[:] = []
    ResponsesCacheMiddleware(Starlette())  # type: ignore[arg-type]
    assert logging.getLogger("responses_cache").handlers == []


# -- configuration: the environment ------------------------------------------------------------


def test_the_settings_come_from_the_environment() -> None:
    env = {"RESPONSES_CACHE_MODEL": "m", "RESPONSES_CACHE_HTTP": "On", "RESPONSES_CACHE_ENDPOINT": "generate",
           "RESPONSES_CACHE_HF_FAST": "0", "VLLM_API_KEY": "sk-1", "HOME": "/root"}
    assert MiddlewareSettings.from_env(env) == MiddlewareSettings(model="m", http=True, endpoint="generate", api_key="sk-1")
    assert MiddlewareSettings.from_env({"RESPONSES_CACHE_MODEL": "m", "RESPONSES_CACHE_HTTP": "0"}).http is False


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RESPONSES_CACHE_ENDPIONT": "generate"}, "does not read RESPONSES_CACHE_ENDPIONT: its variables are"),
        ({"RESPONSES_CACHE_STORE_MAX_BYTES": "1"}, "a `responses-cache serve` setting does not apply inside vLLM"),
        ({"RESPONSES_CACHE_HTTP": "maybe"}, "RESPONSES_CACHE_HTTP='maybe' is not a boolean"),
        ({"RESPONSES_CACHE_PATH": "v1/responses"}, "RESPONSES_CACHE_PATH='v1/responses' is not a path"),
        ({"RESPONSES_CACHE_LOG_LEVEL": "loud"}, "RESPONSES_CACHE_LOG_LEVEL='loud' is not a logging level"),
    ],
)
def test_a_variable_the_middleware_cannot_take_stops_the_start(
    env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"RESPONSES_CACHE_MODEL": "m", **env}
    with pytest.raises(ValueError, match=re.escape(message)):
        MiddlewareSettings.from_env(env)
    # As ``vllm serve`` builds it: the same error from the middleware's constructor.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        ResponsesCacheMiddleware(Starlette())  # type: ignore[arg-type]
