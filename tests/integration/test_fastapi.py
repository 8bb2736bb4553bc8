"""WebSocket mode in an existing FastAPI app, mounted as the docs say, driven by the official SDK.

* Native mode: ``app.add_middleware(WebSocketMode, service=create_service(...))``; the host app's
  lifespan starts and closes the service (its billing worker here), and its own routes keep working.
* The bridge: ``app.add_middleware(WebSocketMode)`` in front of a FastAPI app that serves
  ``POST /v1/responses`` itself; each turn reaches it with the whole conversation.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import StreamingResponse
from openai import AsyncOpenAI, AuthenticationError
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from responses_cache import (
    Biller,
    CallableSink,
    Scenario,
    SimulatedConfig,
    SimulatedEngine,
    UsageRecord,
    WebSocketMode,
    create_service,
)
from responses_cache.testing import LiveServer

KEY = "sk-host"
TOOLS = [
    {
        "type": "function",
        "name": "run",
        "description": "Run one step.",
        "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]},
    }
]


async def tool_loop(server: LiveServer, turns: int, model: str) -> list[Any]:
    """The SDK's WebSocket tool loop: answer each function call until the model answers in text."""
    client = AsyncOpenAI(base_url=server.http_url, api_key=KEY, max_retries=0)
    finals: list[Any] = []
    async with client, client.responses.connect() as conn:
        body: dict[str, Any] = {"model": model, "input": "Do the steps.", "tools": TOOLS, "store": False}
        for _ in range(turns):
            await conn.response.create(**body)
            async for event in conn:
                if event.type == "error":
                    raise AssertionError(event)
                if event.type in ("response.completed", "response.failed", "response.incomplete"):
                    break
            assert event.type == "response.completed", event
            finals.append(event.response)
            calls = [item for item in event.response.output if item.type == "function_call"]
            if not calls:
                break
            output = [{"type": "function_call_output", "call_id": c.call_id, "output": "done"} for c in calls]
            body = {"model": model, "input": output, "tools": TOOLS, "store": False, "previous_response_id": event.response.id}
    return finals


def host_app(startup: list[str]) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        startup.append("host started")
        yield
        startup.append("host stopped")

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


async def test_native_mode_in_fastapi_with_its_lifespan(responses_cache_server_factory: Callable[..., LiveServer]) -> None:
    records: list[UsageRecord] = []
    biller = Biller(CallableSink(records.extend))
    engine = SimulatedEngine(SimulatedConfig(instant=True, scenario=Scenario(tool_calls=3, argument_tokens=5, answer_tokens=5)))
    events: list[str] = []
    app = host_app(events)
    service = create_service(backend=engine, api_keys=[KEY], billing=biller)
    app.add_middleware(WebSocketMode, service=service)
    server = responses_cache_server_factory(app)
    assert events == ["host started"] and service.resources.started  # started inside the lifespan

    finals = await tool_loop(server, 10, "sim-1")
    assert len(finals) == 4 and finals[-1].output[-1].type == "message"
    assert finals[-1].usage.input_tokens_details.cached_tokens > 0  # continued from the token log
    assert httpx.get(f"http://{server.host}:{server.port}/health").json() == {"status": "ok"}
    with pytest.raises(InvalidStatus) as refused:
        connect(server.ws_url, additional_headers={"Authorization": "Bearer wrong"})
    assert refused.value.response.status_code == 401

    server.stop()
    assert events == ["host started", "host stopped"]
    assert not service.resources.started  # closed: billing drained before the host stopped
    assert sorted(r.response_id for r in records) == sorted(f.id for f in finals)


def test_create_service_refuses_to_let_everyone_in() -> None:
    with pytest.raises(ValueError, match="api_keys"):
        create_service(backend=SimulatedEngine())


def responses_app() -> tuple[FastAPI, list[dict[str, Any]]]:
    """A FastAPI Responses server of its own (SSE only, no ``previous_response_id``): it calls
    ``run`` once per user turn, then answers with how many items it was sent.

    Its handlers find their state where FastAPI apps (and vLLM's own handlers) keep it:
    ``request.app.state`` (set on the app) and ``request.state`` (what the lifespan yielded)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        yield {"received": received}

    app = FastAPI(lifespan=lifespan)
    app.state.models = ["host-1"]
    received: list[dict[str, Any]] = []

    def check(authorization: str | None) -> None:
        if authorization != f"Bearer {KEY}":
            raise HTTPException(status_code=401, detail="bad key")

    @app.get("/v1/models")
    async def models(request: Request, authorization: str | None = Header(default=None)) -> dict[str, Any]:
        check(authorization)
        return {"object": "list", "data": [{"id": m, "object": "model"} for m in request.app.state.models]}

    @app.post("/v1/responses")
    async def create(request: Request, authorization: str | None = Header(default=None)) -> StreamingResponse:
        check(authorization)
        body = await request.json()
        if body["model"] not in request.app.state.models:
            raise HTTPException(status_code=404, detail="no such model")
        request.state.received.append(body)
        n = len(received)
        outputs = sum(1 for item in body["input"] if item.get("type") == "function_call_output")
        response = {"id": f"resp_h{n}", "object": "response", "status": "completed", "output": [], "usage": {
            "input_tokens": len(body["input"]), "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0}}}
        if outputs < 2:
            item = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": "run", "arguments": ""}
            middle = [
                {"type": "response.output_item.added", "output_index": 0, "item": item},
                {"type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": 0,
                 "delta": json.dumps({"step": outputs + 1})},
            ]
        else:
            item = {"type": "message", "id": "m", "role": "assistant", "content": []}
            middle = [
                {"type": "response.output_item.added", "output_index": 0, "item": item},
                {"type": "response.output_text.delta", "item_id": "m", "output_index": 0, "content_index": 0,
                 "delta": f"seen {len(body['input'])} items"},
            ]
        events = [{"type": "response.created", "response": {**response, "status": "in_progress"}}, *middle,
                  {"type": "response.completed", "response": response}]

        async def stream() -> AsyncIterator[bytes]:
            for i, event in enumerate(events):
                yield f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': i})}\n\n".encode()

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app, received


async def test_the_bridge_in_fastapi(responses_cache_server_factory: Callable[..., LiveServer]) -> None:
    app, received = responses_app()
    app.add_middleware(WebSocketMode)
    server = responses_cache_server_factory(app)
    finals = await tool_loop(server, 10, "host-1")
    assert [f.output[0].type for f in finals] == ["function_call", "function_call", "message"]
    assert finals[-1].output[0].content[0].text == "seen 5 items"
    # Every bridged turn carried the whole conversation: 1, then 3 (+call, +output), then 5 items.
    assert [len(b["input"]) for b in received] == [1, 3, 5]
    assert all("previous_response_id" not in b for b in received)
    bad = AsyncOpenAI(base_url=server.http_url, api_key="wrong", max_retries=0)
    async with bad:
        with pytest.raises(AuthenticationError):
            await bad.models.list()
