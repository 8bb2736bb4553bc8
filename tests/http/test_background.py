"""Background responses with the official SDK (strict validation) over a real loopback socket:
``create(background=True)``, ``retrieve`` (status, and the event stream resumed with
``starting_after``), ``cancel`` (the engine request aborted, the usage billed ``cancelled``), and
a restart that marks what a dead process left running ``failed``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai._models import validate_type
from openai.types.responses import ResponseStreamEvent

from responses_cache import create_app
from responses_cache.billing import Biller, JsonlSink
from responses_cache.billing.journal import OpenEntry, UsageJournal
from responses_cache.billing.record import UsageRecord
from responses_cache.pipeline.turn import Lineage
from responses_cache.protocol.request import decode_create
from responses_cache.protocol.response import Response
from responses_cache.storage.store import MemoryResponseStore, StoredResponse
from responses_cache.testing import GatedBackend

MODEL = "gate-1"
KEYS = {"sk-a": "tenant-a", "sk-b": "tenant-b"}
DEADLINE_S = 10


class Records:
    """A usage submitter that keeps what it is given."""

    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def submit(self, record: UsageRecord) -> None:
        self.records.append(record)


def _client(server: Any, key: str = "sk-a") -> OpenAI:
    return OpenAI(base_url=server.http_url, api_key=key, max_retries=0, _strict_response_validation=True)


def _strict(events: list[Any]) -> list[Any]:
    """The SDK parses stream events leniently: each is validated strictly here."""
    for event in events:
        validate_type(type_=ResponseStreamEvent, value=event.to_dict())
    return events


def _started(engine: GatedBackend) -> None:
    assert engine.started.wait(DEADLINE_S), "the engine never got the request"


def test_background_response_runs_without_the_client_and_streams_again(responses_cache_server_factory: Any) -> None:
    engine = GatedBackend()
    server = responses_cache_server_factory(backend=engine, api_keys=KEYS)
    client = _client(server)
    queued = client.responses.create(model=MODEL, input="Work on it.", background=True, store=True)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    _started(engine)
    running = client.responses.retrieve(queued.id)
    assert running.status == "in_progress" and running.background is True
    with pytest.raises(openai.NotFoundError):  # tenant-scoped
        _client(server, "sk-b").responses.retrieve(queued.id)

    engine.release()
    events = _strict(list(client.responses.retrieve(queued.id, stream=True, starting_after=1)))
    assert [e.sequence_number for e in events] == list(range(2, 2 + len(events)))
    assert events[-1].type == "response.completed"
    final = client.responses.retrieve(queued.id)
    assert final.status == "completed" and final.output_text == "partial done" and final.background is True
    everything = _strict(list(client.responses.retrieve(queued.id, stream=True)))  # from the start, after the end
    assert everything[0].type == "response.created" and everything[2:] == events
    # a background response continues like any stored one, and its input items are listed
    follow = client.responses.create(model=MODEL, input="Thanks.", previous_response_id=queued.id, background=True)
    engine.release()
    assert [i.type for i in client.responses.input_items.list(follow.id)] == ["message", "message", "message"]


def test_background_create_streamed_outlives_its_connection(responses_cache_server_factory: Any) -> None:
    engine = GatedBackend()
    server = responses_cache_server_factory(backend=engine)
    client = _client(server)
    with client.responses.create(model=MODEL, input="Go.", background=True, stream=True) as stream:
        first = next(iter(stream))
        assert first.type == "response.created" and first.response.background is True
    # the client went away; the response did not
    _started(engine)
    assert client.responses.retrieve(first.response.id).status == "in_progress"
    engine.release()
    tail = _strict(list(client.responses.retrieve(first.response.id, stream=True, starting_after=0)))
    assert tail[0].sequence_number == 1 and tail[-1].type == "response.completed"


def test_cancel_aborts_the_engine_request_and_bills_it_cancelled(responses_cache_server_factory: Any) -> None:
    engine, billing = GatedBackend(), Records()
    server = responses_cache_server_factory(backend=engine, api_keys=KEYS, billing=billing)
    client = _client(server)
    queued = client.responses.create(model=MODEL, input="Long job.", background=True)
    _started(engine)
    with pytest.raises(openai.NotFoundError):  # another tenant cannot cancel it
        _client(server, "sk-b").responses.cancel(queued.id)
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled" and cancelled.output == []  # no item was finished
    assert engine.aborted.is_set()
    (record,) = billing.records
    assert record.status == "cancelled" and record.response_id == queued.id and record.output_tokens == 1
    assert client.responses.retrieve(queued.id).status == "cancelled"
    assert client.responses.cancel(queued.id).status == "cancelled"  # idempotent
    events = _strict(list(client.responses.retrieve(queued.id, stream=True)))
    assert events[0].type == "response.created" and events[-1].type == "response.output_text.delta"


def test_bad_background_requests(responses_cache_server_factory: Any) -> None:
    engine = GatedBackend()
    server = responses_cache_server_factory(backend=engine, api_keys=KEYS)
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="x", background=True, store=False)
    assert caught.value.param == "store"
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nope")
    queued = client.responses.create(model=MODEL, input="x", background=True)
    _started(engine)
    with pytest.raises(openai.BadRequestError) as caught:  # its parent is still running
        client.responses.create(model=MODEL, input="y", previous_response_id=queued.id)
    assert caught.value.code == "previous_response_in_progress"
    engine.release()
    list(client.responses.retrieve(queued.id, stream=True))
    with pytest.raises(openai.BadRequestError):  # finished: nothing to cancel
        client.responses.cancel(queued.id)
    raw = httpx.Client(base_url=server.http_url, headers={"authorization": "Bearer sk-a"})
    reply = raw.get(f"/responses/{queued.id}", params={"stream": "true", "starting_after": "x"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "starting_after"


def test_only_background_responses_are_cancelled_or_streamed_again(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory()
    client = _client(server)
    done = client.responses.create(model="sim-1", input="hi")
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(done.id)
    with pytest.raises(openai.BadRequestError):
        list(client.responses.retrieve(done.id, stream=True))


async def test_a_restart_marks_what_a_dead_process_left_running_failed(tmp_path: Path) -> None:
    """The crash is the state it leaves: the journal's open entry without a close, and the store
    still saying ``in_progress``."""
    journal_path = tmp_path / "usage.journal"
    store = MemoryResponseStore()
    with UsageJournal(journal_path) as journal:
        for rid, background in (("resp_bg", True), ("resp_fg", False)):
            journal.append_open(
                OpenEntry(id=rid, tenant="default", model=MODEL, route="default", created_at=1.0, input_tokens=5, background=background)
            )
            response = Response(
                id=rid, created_at=1, status="in_progress", model=MODEL, output=[], tools=[], tool_choice="auto",
                parallel_tool_calls=True, background=background,
            )
            await store.put(StoredResponse("default", response, (), None, b"[]"))
    billing = Biller(JsonlSink(tmp_path / "usage.jsonl"), journal_path=journal_path)
    app = create_app(backend=GatedBackend(), store=store, billing=billing)
    async with app.router.lifespan_context(app):
        assert app.state.service.background.recovered == 1
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            failed = (await client.get("/v1/responses/resp_bg")).json()
            untouched = (await client.get("/v1/responses/resp_fg")).json()
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert untouched["status"] == "in_progress"  # not a background response: not ours to mark


async def test_a_response_cancelled_before_it_starts_is_stored_cancelled() -> None:
    engine, billing = GatedBackend(), Records()
    app = create_app(backend=engine, billing=billing)
    async with app.router.lifespan_context(app):
        service = app.state.service
        turn = service.core.prepare(decode_create(b'{"model": "gate-1", "input": "x", "background": true}'), "default", "http")
        route = service.core.router.resolve(turn.model, "default")
        queued = await service.background.submit(turn, Lineage.first(turn), route)
        assert queued.status == "queued"
        cancelled = await service.background.cancel("default", turn.response_id)  # before its task ran
        assert cancelled.status == "cancelled" and service.background.running == 0
        stored = await service.core.store.get("default", turn.response_id)
        assert stored.response.status == "cancelled"
    assert not engine.started.is_set() and billing.records == []  # never created: nothing to bill
