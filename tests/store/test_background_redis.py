"""Background responses with the Redis store and two servers: the one that did not start the
response answers ``retrieve`` (status and the event stream) and ``cancel`` (the running server
is told, and aborts its engine request)."""

from __future__ import annotations

from typing import Any

from openai import OpenAI
from openai._models import validate_type
from openai.types.responses import ResponseStreamEvent

from responses_cache.storage.redis_store import RedisResponseStore
from responses_cache.testing import GatedBackend

MODEL = "gate-1"
DEADLINE_S = 10


def _client(server: Any) -> OpenAI:
    return OpenAI(base_url=server.http_url, api_key="sk-a", max_retries=0, _strict_response_validation=True)


def _servers(factory: Any, redis_url: str) -> tuple[GatedBackend, Any, Any]:
    engine = GatedBackend()
    options: dict[str, Any] = {"api_keys": {"sk-a": "tenant-a"}, "own_store": True}
    a = factory(backend=engine, store=RedisResponseStore(redis_url), **options)
    b = factory(backend=GatedBackend(), store=RedisResponseStore(redis_url), **options)
    return engine, a, b


def test_another_server_streams_a_running_response(responses_cache_server_factory: Any, redis_url: str) -> None:
    engine, a, b = _servers(responses_cache_server_factory, redis_url)
    queued = _client(a).responses.create(model=MODEL, input="Work.", background=True)
    assert engine.started.wait(DEADLINE_S)
    assert _client(b).responses.retrieve(queued.id).status == "in_progress"
    engine.release()
    events = list(_client(b).responses.retrieve(queued.id, stream=True, starting_after=0))
    for event in events:
        validate_type(type_=ResponseStreamEvent, value=event.to_dict())
    assert [e.sequence_number for e in events] == list(range(1, 1 + len(events)))
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "partial done"
    assert _client(b).responses.retrieve(queued.id).status == "completed"


def test_another_server_cancels_a_running_response(responses_cache_server_factory: Any, redis_url: str) -> None:
    engine, a, b = _servers(responses_cache_server_factory, redis_url)
    queued = _client(a).responses.create(model=MODEL, input="Work.", background=True)
    assert engine.started.wait(DEADLINE_S)
    cancelled = _client(b).responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert engine.aborted.wait(DEADLINE_S)  # A was told, and aborted its engine request
    assert a.app.state.service.background.running == 0
    assert _client(a).responses.retrieve(queued.id).status == "cancelled"
