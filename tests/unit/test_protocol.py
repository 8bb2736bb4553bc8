"""Wire types: decoding the create body and items, and error envelopes naming the bad field."""

from __future__ import annotations

import msgspec
import pytest

from responses_cache.protocol import events as ev
from responses_cache.protocol.codec import encode
from responses_cache.protocol.errors import ResponsesError
from responses_cache.protocol.items import FunctionCallOutput, InputText, Message, Reasoning
from responses_cache.protocol.request import decode_create, decode_input
from responses_cache.protocol.tools import FunctionTool, HostedTool, NamespaceTool, parse_tools


def test_every_documented_field_and_unknown_fields_are_accepted() -> None:
    body = {
        "model": "m", "input": "hi", "instructions": "x", "tools": [], "tool_choice": "auto",
        "parallel_tool_calls": False, "previous_response_id": None, "store": False, "include": ["a"],
        "reasoning": {"effort": "low"}, "text": {"format": {"type": "text"}}, "max_output_tokens": 5,
        "max_tool_calls": 2, "metadata": {"k": "v"}, "prompt_cache_key": "p", "safety_identifier": "s",
        "service_tier": "auto", "temperature": 0.5, "top_p": 1.0, "top_logprobs": 0, "truncation": "auto",
        "user": "u", "stream": True, "background": False, "context_management": [], "stream_options": {},
        "prompt_cache_retention": "24h", "client_metadata": {"a": "b"}, "something_new": {"x": 1},
    }
    request = decode_create(msgspec.json.encode(body))
    assert request.model == "m" and request.store is False and request.max_output_tokens == 5


def test_input_forms() -> None:
    assert decode_input(msgspec.Raw(b'"hello"')) == [Message(role="user", content="hello")]
    items = decode_input(
        msgspec.Raw(
            b'[{"role":"developer","content":"d"},'
            b'{"type":"message","role":"user","content":[{"type":"input_text","text":"t"}],"id":"msg_1"},'
            b'{"type":"function_call_output","call_id":"c","output":"o","id":"fco_1"},'
            b'{"type":"reasoning","summary":[],"encrypted_content":"zz"}]'
        )
    )
    assert items[0] == Message(role="developer", content="d")
    assert items[1] == Message(role="user", content=[InputText(text="t")], id="msg_1")
    assert isinstance(items[2], FunctionCallOutput) and items[2].id == "fco_1"
    assert isinstance(items[3], Reasoning) and items[3].encrypted_content == "zz"


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (b"[1, 2]", "invalid_type", None),
        (b'{"model": "m", "input": [{"type": "message", "role": "robot", "content": "x"}]}', "invalid_value", "input[0].role"),
        (b'{"model": "m", "input": [3]}', "invalid_type", "input[0]"),
        (b'{"model": "m", "input": 3}', "invalid_type", "input"),
        (b'{"model": "m", "tools": [{"name": "x"}]}', "missing_required_parameter", "tools[0].type"),
        (b'{"model": "m", "tools": [{"type": "function"}]}', "missing_required_parameter", "tools[0].name"),
    ],
)
def test_errors_name_the_field(body: bytes, code: str, param: str | None) -> None:
    with pytest.raises(ResponsesError) as err:
        request = decode_create(body)
        decode_input(request.input)
        parse_tools(request.tools)
    assert err.value.status == 400 and err.value.code == code and err.value.param == param


def test_tools_are_parsed_once_per_distinct_bytes() -> None:
    from responses_cache.protocol.tools import tool_cache

    raw = b'[{"type":"function","name":"f0f0"},{"type":"namespace","name":"ns","tools":[{"type":"function","name":"g"}]},{"type":"web_search"}]'
    before = tool_cache.parses
    first = parse_tools(raw)
    tool_cache.remember(first)  # what the pipeline does once a turn succeeded
    second = parse_tools(raw)
    assert first is second and tool_cache.parses == before + 1
    assert isinstance(first.tools[0], FunctionTool) and isinstance(first.tools[1], NamespaceTool)
    assert isinstance(first.tools[2], HostedTool)
    assert [(ns, t.name) for ns, t in first.functions()] == [(None, "f0f0"), ("ns", "g")]


def test_events_encode_sequence_numbers_and_lanes() -> None:
    delta = ev.OutputTextDelta(item_id="m", output_index=0, content_index=0, delta="a", logprobs=[], sequence_number=0)
    data = msgspec.json.decode(encode(delta))
    assert data["type"] == "response.output_text.delta" and data["sequence_number"] == 0 and data["logprobs"] == []
    assert "stream_id" not in data
    delta.stream_id = "lane-1"
    assert msgspec.json.decode(encode(delta))["stream_id"] == "lane-1"
    err = msgspec.json.decode(encode(ev.ErrorEvent(status=400, error=ResponsesError("x", code="c").payload)))
    assert err == {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": "c", "message": "x", "param": None}}
