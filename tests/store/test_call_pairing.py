"""Tool outputs are paired with their calls the same way for function calls and custom (freeform)
tool calls, wherever the calls a response left open come from: the same input, the parent's
input carried in this process, or the parent rebuilt from the Redis store by another process
(``open_calls`` recomputed from the stored chain). Over HTTP, on a token route (rendered) and a
message route (items handed to the backend unrendered, where validation is the only check):

* an output whose call is open is accepted, and the backend gets the call and the output;
* an output with no open call of its ``call_id`` (never made, or answered already) is 400
  ``invalid_function_call_output`` with ``param: input[i].call_id`` (docs/input-items.md).

Hosted-tool items are refused on a token route whatever their pairing (``unsupported_value``),
and carried unchanged, unpaired, on a message route (docs/input-items.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from responses_cache import create_app
from responses_cache.conversation.sealing import Sealer, new_key
from responses_cache.storage.redis_store import RedisResponseStore
from responses_cache.testing import RecordingBackend

TOOLS: list[dict[str, Any]] = [
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch."},
    {"type": "function", "name": "run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
]
CALLS = {
    "function": ({"type": "function_call", "call_id": "c1", "name": "run", "arguments": '{"cmd": "ls"}'},
                 {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}),
    "custom": ({"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"},
               {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"}),
}


class Apps:
    """The process that makes the call, and the one that gets its output (the same one, or
    another on the same Redis store)."""

    def __init__(self, first: Any, second: Any, backend: RecordingBackend) -> None:
        self.first, self.second, self.backend = first, second, backend

    async def post(self, app: Any, body: dict[str, Any]) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t/v1") as client:
            return await client.post("/responses", json={"model": "sim-1", "tools": TOOLS, **body})


@pytest.fixture(params=["token", "message", "token-hydrated", "message-hydrated"])
async def apps(request: pytest.FixtureRequest) -> AsyncIterator[Apps]:
    renderer = None if request.param.startswith("message") else "harmony"
    backend = RecordingBackend()
    if not request.param.endswith("hydrated"):
        app = create_app(backend=backend, renderer=renderer)
        yield Apps(app, app, backend)
        return
    url = request.getfixturevalue("single_redis_url")
    key = new_key()
    one = create_app(backend=RecordingBackend(), renderer=renderer, store=RedisResponseStore(url), own_store=True,
                     sealer=Sealer.from_text(key))
    two = create_app(backend=backend, renderer=renderer, store=RedisResponseStore(url), own_store=True,
                     sealer=Sealer.from_text(key))
    async with one.router.lifespan_context(one), two.router.lifespan_context(two):
        yield Apps(one, two, backend)


_WIRE = {"FunctionCall": "function_call", "FunctionCallOutput": "function_call_output",
         "CustomToolCall": "custom_tool_call", "CustomToolCallOutput": "custom_tool_call_output"}


def _seen(backend: RecordingBackend) -> list[str]:
    """The wire types of the items the backend's last request held."""
    items = backend.requests[-1].conversation.items()
    return [getattr(i, "type", None) or _WIRE.get(type(i).__name__, type(i).__name__) for i in items]


def _refused(answer: httpx.Response, index: int) -> None:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_function_call_output" and error["param"] == f"input[{index}].call_id", error


@pytest.mark.parametrize("kind", ["function", "custom"])
async def test_an_output_of_a_call_in_the_same_input_is_accepted(apps: Apps, kind: str) -> None:
    call, output = CALLS[kind]
    answer = await apps.post(apps.second, {"input": [{"role": "user", "content": "go"}, call, output]})
    assert answer.status_code == 200, answer.text
    assert _seen(apps.backend)[-2:] == [call["type"], output["type"]]


@pytest.mark.parametrize("kind", ["function", "custom"])
async def test_an_output_with_no_call_is_refused(apps: Apps, kind: str) -> None:
    _, output = CALLS[kind]
    _refused(await apps.post(apps.second, {"input": [{"role": "user", "content": "go"}, output]}), 1)
    assert apps.backend.requests == []


@pytest.mark.parametrize("kind", ["function", "custom"])
async def test_an_output_of_the_parents_open_call_is_accepted_once(apps: Apps, kind: str) -> None:
    call, output = CALLS[kind]
    parent = await apps.post(apps.first, {"input": [{"role": "user", "content": "go"}, call]})
    assert parent.status_code == 200, parent.text
    previous = parent.json()["id"]
    answered = await apps.post(apps.second, {"input": [output], "previous_response_id": previous})
    assert answered.status_code == 200, answered.text
    assert _seen(apps.backend).count(output["type"]) == 1
    # The call is answered now: a second output of it, continuing the answered response, is
    # refused (by the first process too, which rebuilds the answered response from the store).
    for app in (apps.second, apps.first):
        again = await apps.post(app, {"input": [output], "previous_response_id": answered.json()["id"]})
        _refused(again, 0)
    # And one of a call_id the parent never made, too.
    stray = {**output, "call_id": "c2"}
    _refused(await apps.post(apps.second, {"input": [stray], "previous_response_id": previous}), 0)


async def test_hosted_tool_items_are_refused_on_a_token_route_and_carried_on_a_message_route(apps: Apps) -> None:
    call = {"type": "apply_patch_call", "call_id": "h1", "status": "completed",
            "operation": {"type": "update_file", "path": "a.py", "diff": "+x"}}
    output = {"type": "apply_patch_call_output", "call_id": "h1", "status": "completed"}
    answer = await apps.post(apps.second, {"input": [{"role": "user", "content": "go"}, call, output],
                                           "truncation": "auto"})
    if apps.second.state.service.core.router.resolve("sim-1", "").renderer is not None:
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "unsupported_value", answer.text
        assert answer.json()["error"]["param"] == "input[1].type"
    else:
        assert answer.status_code == 200, answer.text
        assert _seen(apps.backend)[-2:] == [call["type"], output["type"]]
