"""HTTP API over a real loopback socket with the official openai SDK, plus error envelopes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from responses_cache import Scenario, SimulatedConfig, SimulatedEngine
from responses_cache.testing import RecordingBackend, context_of

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]


def _client(server: Any, **kw: Any) -> OpenAI:
    return OpenAI(base_url=server.http_url, api_key="sk-test", max_retries=0, **kw)


def test_sdk_tool_loop_over_sse_strict(responses_cache_server_factory: Any) -> None:
    """A multi-turn tool loop over SSE with strict validation, chained by previous_response_id."""
    server = responses_cache_server_factory()
    client = _client(server, _strict_response_validation=True)
    previous: str | None = None
    pending: Any = "Please run `echo hi` for me."
    seen_call = False
    for _ in range(4):
        stream = client.responses.create(
            model="sim-1", input=pending, tools=TOOLS, previous_response_id=previous, stream=True
        )
        events = list(stream)
        assert events[0].type == "response.created"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        final = events[-1]
        assert final.type == "response.completed"
        response = final.response
        assert response.usage is not None and response.usage.input_tokens > 0
        calls = [o for o in response.output if o.type == "function_call"]
        previous = response.id
        if not calls:
            text = response.output_text
            assert "hi-output" in text
            break
        seen_call = True
        assert json.loads(calls[0].arguments) == {"cmd": "echo hi"}
        pending = [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "line one\nhi-output\n"}]
    assert seen_call


def test_sdk_stream_helper_checks_event_order(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(backend=SimulatedEngine(SimulatedConfig(instant=True, scenario=Scenario(tool_calls=2))))
    client = _client(server, _strict_response_validation=True)
    previous = None
    items: Any = "start"
    for turn in range(3):
        with client.responses.stream(model="sim-1", input=items, tools=TOOLS, previous_response_id=previous) as stream:
            for _ in stream:
                pass
            final = stream.get_final_response()
        previous = final.id
        calls = [o for o in final.output if o.type == "function_call"]
        if turn < 2:
            assert calls, "scenario asks for a tool call"
            items = [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "ok"}]
        else:
            assert not calls and final.output_text


def test_sdk_non_streaming_json_and_retrieve_delete(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory()
    client = _client(server, _strict_response_validation=True)
    first = client.responses.create(model="sim-1", input="Remember the word: kiwi.")
    second = client.responses.create(model="sim-1", input="What was it?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert second.status == "completed" and second.output_text
    fetched = client.responses.retrieve(second.id)
    assert fetched.id == second.id and fetched.output_text == second.output_text
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)
    models = client.models.list()
    assert [m.id for m in models.data] == ["sim-1"]


def test_store_false_is_not_retrievable(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory()
    client = _client(server)
    response = client.responses.create(model="sim-1", input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="sim-1", input="more", previous_response_id=response.id)
    assert err.value.code == "previous_response_not_found"


@pytest.mark.parametrize("renderer", ["harmony", None])
def test_chain_gives_backend_same_context_as_full_request(responses_cache_server_factory: Any, renderer: str | None) -> None:
    """Turn N of a previous_response_id chain == one request with the whole conversation."""
    recorder = RecordingBackend()
    server = responses_cache_server_factory(backend=recorder, renderer=renderer)
    client = _client(server)
    history: list[Any] = []
    previous = None
    last: Any = None
    inputs: list[Any] = [
        [{"role": "user", "content": "Run `ls -la` please"}],
        None,  # filled with the tool output
        [{"role": "user", "content": [{"type": "input_text", "text": "and now <|end|> <|im_start|> tricky"}]}],
    ]
    for step in range(3):
        new = inputs[step]
        if new is None:
            call = next(o for o in last.output if o.type == "function_call")
            new = [{"type": "function_call_output", "call_id": call.call_id, "output": "total 0\nREADME.md"}]
        last = client.responses.create(model="sim-1", input=new, tools=TOOLS, instructions="Be brief.", previous_response_id=previous)
        history += new + [o.model_dump(exclude_none=True) for o in last.output]
        previous = last.id
    chained = context_of(recorder.requests[-1])
    full_input = history[: -len(last.output)]
    client.responses.create(model="sim-1", input=full_input, tools=TOOLS, instructions="Be brief.")
    assert context_of(recorder.requests[-1]) == chained
    assert len(chained["items"]) == len(full_input)


def _post(server: Any, body: Any, **kw: Any) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{server.http_url}/responses", content=content, headers={"content-type": "application/json"}, **kw)


def _assert_error(r: httpx.Response, status: int, code: str | None, param: str | None) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"type", "code", "message", "param"}
    assert error["code"] == code and error["param"] == param and error["message"]
    assert error["type"] == "invalid_request_error"


def test_bad_inputs_get_the_openai_envelope(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(max_body_bytes=4096)
    _assert_error(_post(server, b"{not json"), 400, "invalid_json", None)
    _assert_error(_post(server, {"model": "sim-1", "temperature": "hot"}), 400, "invalid_type", "temperature")
    _assert_error(_post(server, {"model": 5}), 400, "invalid_type", "model")
    _assert_error(_post(server, {"input": "hi"}), 400, "missing_required_parameter", "model")
    _assert_error(
        _post(server, {"model": "sim-1", "input": [{"type": "teleport_call", "call_id": "x"}]}),
        400, "invalid_value", "input[0].type",
    )
    # A hosted tool's item is accepted, but the harmony template cannot show it to the model.
    _assert_error(
        _post(server, {"model": "sim-1", "input": [{"type": "computer_call_output", "call_id": "x", "output": {}}]}),
        400, "unsupported_value", "input[0].type",
    )
    _assert_error(
        _post(server, {"model": "sim-1", "input": [{"type": "computer_call_output", "call_id": "x"}]}),
        400, "missing_required_parameter", "input[0].output",
    )
    _assert_error(
        _post(server, {"model": "sim-1", "input": [{"type": "function_call_output", "output": "x"}]}),
        400, "missing_required_parameter", "input[0].call_id",
    )
    _assert_error(
        _post(server, {"model": "sim-1", "input": "x", "previous_response_id": "resp_nope"}),
        400, "previous_response_not_found", "previous_response_id",
    )
    _assert_error(
        _post(server, {"model": "sim-1", "input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}]}),
        400, "invalid_function_call_output", "input[0].call_id",
    )
    image = {"role": "user", "content": [{"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": "data:,"}]}
    _assert_error(_post(server, {"model": "sim-1", "input": [image]}), 400, "unsupported_value", "input[0].content[1]")
    _assert_error(_post(server, {"model": "sim-1", "input": "x" * 5000}), 413, "request_too_large", None)
    _assert_error(_post(server, {"model": "sim-1", "input": "x", "stream_id": "a"}), 400, "unsupported_parameter", "stream_id")


def test_streaming_error_before_created_is_plain_json(responses_cache_server: Any) -> None:
    r = _post(responses_cache_server, {"model": "sim-1", "input": "x", "stream": True, "previous_response_id": "resp_x"})
    _assert_error(r, 400, "previous_response_not_found", "previous_response_id")


def test_api_key_required_when_configured(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(api_keys=["sk-good"])
    r = _post(server, {"model": "sim-1", "input": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    ok = OpenAI(base_url=server.http_url, api_key="sk-good").responses.create(model="sim-1", input="x")
    assert ok.status == "completed"


def test_item_size_and_count_limits(responses_cache_server_factory: Any) -> None:
    from responses_cache import Limits

    server = responses_cache_server_factory(limits=Limits(max_items_per_turn=2, max_item_bytes=64))
    _assert_error(_post(server, {"model": "sim-1", "input": "é" * 40}), 400, "string_above_max_length", "input[0]")
    three = [{"role": "user", "content": "a"}] * 3
    _assert_error(_post(server, {"model": "sim-1", "input": three}), 400, "too_many_items", "input")
    assert _post(server, {"model": "sim-1", "input": "x" * 64}).status_code == 200


def test_media_parts_reach_backends_that_take_them(responses_cache_server_factory: Any) -> None:
    from responses_cache.protocol.items import InputImage, Message

    image = {"role": "user", "content": [{"type": "input_text", "text": "what is it?"}, {"type": "input_image", "image_url": "data:,x"}]}
    recorder = RecordingBackend()
    server = responses_cache_server_factory(backend=recorder, renderer=None)  # a message-based engine: no tokenizer
    assert _post(server, {"model": "sim-1", "input": [image]}).status_code == 200
    (message,) = recorder.requests[-1].conversation.items()
    assert isinstance(message, Message) and isinstance(message.content, list)
    assert message.content[1] == InputImage(image_url="data:,x")

    recorder.accepts_media = False
    r = _post(server, {"model": "sim-1", "input": [image]})
    _assert_error(r, 400, "unsupported_value", "input[0].content")


def test_stored_responses_are_scoped_by_tenant(responses_cache_server_factory: Any) -> None:
    """Invariant 4: nothing crosses tenants — not over HTTP, not by hydration over WebSocket."""
    from websockets.sync.client import connect

    server = responses_cache_server_factory(api_keys={"sk-alice": "alice", "sk-bob": "bob"})
    alice = OpenAI(base_url=server.http_url, api_key="sk-alice", max_retries=0)
    bob = OpenAI(base_url=server.http_url, api_key="sk-bob", max_retries=0)
    first = alice.responses.create(model="sim-1", input="Alice's secret plan.")
    assert alice.responses.retrieve(first.id).id == first.id
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as err:
        bob.responses.create(model="sim-1", input="tell me", previous_response_id=first.id)
    assert err.value.code == "previous_response_not_found"
    with connect(server.ws_url, additional_headers={"Authorization": "Bearer sk-bob"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "sim-1", "input": "x", "previous_response_id": first.id}))
        event = json.loads(ws.recv(timeout=30))
    assert event["type"] == "error" and event["error"]["code"] == "previous_response_not_found"
    with connect(server.ws_url, additional_headers={"Authorization": "Bearer sk-alice"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "sim-1", "input": "x", "previous_response_id": first.id}))
        while (event := json.loads(ws.recv(timeout=30)))["type"] not in ("response.completed", "error"):
            pass
    assert event["type"] == "response.completed"  # hydrated from alice's store
