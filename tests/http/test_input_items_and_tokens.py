"""``client.responses.input_items.list`` and ``client.responses.input_tokens.count`` with the
official SDK (strict response validation) over a real loopback socket, the Redis store too; the
work a count costs is counted in rendered items, never timed."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from responses_cache import create_app
from responses_cache.backends.simulated import SimulatedConfig, SimulatedEngine
from tests.asgi_turns import MODEL, conversation, post, renderer_of

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    }
]


def _client(server: Any, key: str = "sk-a") -> OpenAI:
    return OpenAI(base_url=server.http_url, api_key=key, max_retries=0, _strict_response_validation=True)


def _keys() -> dict[str, str]:
    return {"sk-a": "tenant-a", "sk-b": "tenant-b"}


def _two_turns(client: OpenAI) -> tuple[Any, Any]:
    first = client.responses.create(
        model=MODEL,
        input=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
            {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {"role": "assistant", "content": "Listed."},
        ],
        tools=TOOLS,
    )
    second = client.responses.create(model=MODEL, input="and again", previous_response_id=first.id)
    return first, second


def test_input_items_list_pages_through_the_conversation(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(api_keys=_keys())
    client = _client(server)
    first, second = _two_turns(client)

    own = client.responses.input_items.list(first.id, order="asc")
    assert [i.type for i in own.data] == ["message", "message", "function_call", "function_call_output", "message"]
    assert own.data[0].role == "developer" and own.data[0].content[0].text == "Be brief."  # type: ignore[union-attr]
    assert not own.has_more

    # The second response was generated from the first's input and output, then its own input.
    expected = [(i.type, getattr(i, "role", None)) for i in own.data] + [(o.type, getattr(o, "role", None)) for o in first.output]
    expected.append(("message", "user"))
    everything = list(client.responses.input_items.list(second.id, order="asc", limit=1))  # the SDK follows `after`
    assert [(i.type, getattr(i, "role", None)) for i in everything] == expected
    assert everything[-1].content[0].text == "and again"  # type: ignore[union-attr]
    assert [i.id for i in everything[len(own.data) : -1]] == [o.id for o in first.output]
    assert len({i.id for i in everything}) == len(everything)  # every item named, once

    newest_first = client.responses.input_items.list(second.id)  # default order: desc, limit 20
    assert [i.id for i in newest_first.data] == [i.id for i in reversed(everything)]
    assert newest_first.first_id == everything[-1].id and newest_first.last_id == everything[0].id  # type: ignore[attr-defined]

    page = client.responses.input_items.list(second.id, order="asc", limit=2, include=["reasoning.encrypted_content"])
    assert page.has_more and [i.id for i in page.data] == [i.id for i in everything[:2]]
    again = client.responses.input_items.list(second.id, order="asc", limit=2, after=page.data[-1].id)
    assert [i.id for i in again.data] == [i.id for i in everything[2:4]]


def test_input_items_errors(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(api_keys=_keys())
    client = _client(server)
    first, _ = _two_turns(client)
    unstored = client.responses.create(model=MODEL, input="not kept", store=False)
    for rid, c in ((unstored.id, client), ("resp_nope", client), (first.id, _client(server, "sk-b"))):
        with pytest.raises(openai.NotFoundError) as caught:
            c.responses.input_items.list(rid)
        assert caught.value.code == "response_not_found"
    raw = httpx.Client(base_url=server.http_url, headers={"authorization": "Bearer sk-a"})
    for query, param in (
        ("limit=0", "limit"), ("limit=101", "limit"), ("limit=x", "limit"), ("order=up", "order"),
        ("include[]=everything", "include"), ("after=msg_unknown", "after"),
    ):
        reply = raw.get(f"/responses/{first.id}/input_items?{query}")
        assert reply.status_code == 400, (query, reply.text)
        assert reply.json()["error"]["param"] == param


def test_input_tokens_count_is_the_prompt_the_engine_receives(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(api_keys=_keys())
    client = _client(server)
    body: dict[str, Any] = {"input": "What is the weather?", "instructions": "Answer in French.", "tools": TOOLS}
    counted = client.responses.input_tokens.count(model=MODEL, **body)
    assert counted.object == "response.input_tokens"
    created = client.responses.create(model=MODEL, **body)
    assert created.usage is not None and counted.input_tokens == created.usage.input_tokens

    # previous_response_id: the count of the continuation, as the continuation then reports it
    follow: dict[str, Any] = {"input": "And tomorrow?", "previous_response_id": created.id, "tools": TOOLS}
    counted = client.responses.input_tokens.count(model=MODEL, **follow)
    continued = client.responses.create(model=MODEL, **follow)
    assert continued.usage is not None and counted.input_tokens == continued.usage.input_tokens
    # no model: the server's default model
    assert client.responses.input_tokens.count(input="What is the weather?", instructions="Answer in French.", tools=TOOLS).input_tokens == (
        created.usage.input_tokens
    )
    # counting is not creating: nothing was stored, the next id is not taken
    assert client.responses.input_tokens.count(model=MODEL, input="x", previous_response_id=continued.id).input_tokens > 0


def test_input_tokens_errors(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(api_keys=_keys())
    client = _client(server)
    mine = client.responses.create(model=MODEL, input="mine")
    with pytest.raises(openai.BadRequestError) as caught:  # another tenant's id is not found
        _client(server, "sk-b").responses.input_tokens.count(model=MODEL, input="x", previous_response_id=mine.id)
    assert caught.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.input_tokens.count(model=MODEL, input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}])
    assert caught.value.code == "invalid_function_call_output"
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.input_tokens.count(model=MODEL, input=[{"type": "bogus"}])  # type: ignore[list-item]
    assert caught.value.code == "invalid_value"
    with pytest.raises(openai.AuthenticationError):
        _client(server, "sk-wrong").responses.input_tokens.count(model=MODEL, input="x")


def test_input_tokens_on_a_message_route_is_refused(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory(renderer=None)
    with pytest.raises(openai.BadRequestError) as caught:
        _client(server).responses.input_tokens.count(model=MODEL, input="x")
    assert caught.value.code == "unsupported_value" and caught.value.param == "model"


async def _count_work(app: Any, previous: str) -> tuple[int, int]:
    stats = renderer_of(app).stats
    before = stats.items_rendered
    counted = await post(app, "/v1/responses/input_tokens", {"input": "one more", "previous_response_id": previous})
    return stats.items_rendered - before, counted["input_tokens"]


async def test_counting_after_a_hot_parent_renders_only_the_new_items() -> None:
    app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True)))
    previous = await conversation(app, 8)
    work, count = await _count_work(app, previous)
    assert work == 1  # the new message: none of the 8 earlier turns again
    created = await post(app, "/v1/responses", {"input": "one more", "previous_response_id": previous})
    assert count == created["usage"]["input_tokens"]


async def test_counting_without_a_cached_parent_renders_the_chain() -> None:
    app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True)), hot_cache_bytes=0)
    previous = await conversation(app, 8)
    work, _ = await _count_work(app, previous)
    assert work > 8 * 2
