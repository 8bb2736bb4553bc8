"""``client.responses.compact`` with the official SDK over a real socket, and compaction items
sent back as input: the answer's shape (the SDK's ``CompactedResponse``, validated strictly),
what the engine sees after a compaction (a full render of the kept items, the summary as a user
message), the summary's own usage record, and the 400s for tampered, foreign-tenant, expired or
unopenable ``encrypted_content`` and for bad ``context_management``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgspec
import openai
import pytest
from openai import OpenAI
from openai.types.responses import CompactedResponse, ResponseCompactionItem, ResponseUsage
from openai.types.responses.response_input_item import Message as SDKInputMessage

from responses_cache.conversation import compaction
from responses_cache.conversation.compaction import SUMMARY_PREFIX, SUMMARY_PROMPT, Compaction
from responses_cache.conversation.sealing import Sealer, new_key
from responses_cache.protocol.items import Message
from responses_cache.testing import RecordingBackend
from responses_cache.tokens import BaseRenderer

MODEL = "sim-1"
KEYS = {"sk-a": "tenant-a", "sk-b": "tenant-b"}


class Usage:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def submit(self, record: Any) -> None:
        self.records.append(record)


@pytest.fixture
def sealer() -> Sealer:
    return Sealer.from_text(new_key())


@pytest.fixture
def setup(responses_cache_server_factory: Any, sealer: Sealer) -> tuple[Any, RecordingBackend, Usage]:
    backend, usage = RecordingBackend(), Usage()
    server = responses_cache_server_factory(backend=backend, api_keys=KEYS, sealer=sealer, billing=usage)
    return server, backend, usage


def _client(server: Any, key: str = "sk-a") -> OpenAI:
    return OpenAI(base_url=server.http_url, api_key=key, max_retries=0)


def _renderer(server: Any) -> BaseRenderer:
    renderer = server.app.state.service.core.router.resolve(MODEL, "").renderer
    assert isinstance(renderer, BaseRenderer)
    return renderer


def _compact_raw(server: Any, body: dict[str, Any], key: str = "sk-a") -> httpx.Response:
    return httpx.post(
        f"{server.http_url}/responses/compact", json={"model": MODEL, **body},
        headers={"authorization": f"Bearer {key}"}, timeout=30,
    )


def _conversation(client: OpenAI) -> Any:
    first = client.responses.create(model=MODEL, input="fix the failing test in parser.py", instructions="Be brief.")
    return client.responses.create(
        model=MODEL, input="now add a regression test", previous_response_id=first.id, instructions="Be brief."
    )


def test_compact_answers_a_compacted_response(setup: Any) -> None:
    server, backend, usage = setup
    client = _client(server)
    second = _conversation(client)
    compacted = client.responses.compact(
        model=MODEL, previous_response_id=second.id, input="and update the docs", instructions="Be brief."
    )
    assert isinstance(compacted, CompactedResponse)
    raw = _compact_raw(server, {"previous_response_id": second.id, "instructions": "Be brief."}).json()
    # Strict: every field the SDK types, exactly; user messages as input messages, then one compaction item.
    assert set(raw) == {"id", "object", "created_at", "output", "usage"} and raw["object"] == "response.compaction"
    ResponseUsage.model_validate(raw["usage"], strict=True)
    *messages, last = raw["output"]
    item = ResponseCompactionItem.model_validate(last, strict=True)
    assert set(last) == {"type", "id", "encrypted_content"} and item.encrypted_content.startswith("rcs1.")
    for m in messages:
        SDKInputMessage.model_validate(m, strict=True)
    assert [m["content"][0]["text"] for m in messages] == ["fix the failing test in parser.py", "now add a regression test"]
    # The summary was an ordinary generation: the conversation, then the documented prompt.
    summary_request = backend.requests[-1]
    tail = summary_request.conversation.items()[-1]
    assert isinstance(tail, Message) and tail.content == SUMMARY_PROMPT
    assert summary_request.tool_choice == "none"
    # Billed on its own, under the compacted response's id.
    record = next(r for r in usage.records if r.response_id == raw["id"])
    assert record.input_tokens == raw["usage"]["input_tokens"] > 0 and record.output_tokens > 0


def test_the_compacted_output_continues_the_conversation(setup: Any, sealer: Sealer) -> None:
    server, backend, _ = setup
    client = _client(server)
    second = _conversation(client)
    raw = _compact_raw(server, {"previous_response_id": second.id, "instructions": "Be brief."}).json()
    summary = compaction.open_items(sealer, "tenant-a", [_hosted(raw["output"][-1])])[0]
    assert isinstance(summary, Compaction) and "parser.py" in summary.summary  # the simulated engine's summary
    follow = client.responses.create(
        model=MODEL, input=[*raw["output"], {"role": "user", "content": "continue"}], instructions="Be brief."
    )
    assert follow.status == "completed"
    request = backend.requests[-1]
    renderer = _renderer(server)
    kept = [
        Message(role="user", content="fix the failing test in parser.py"),
        Message(role="user", content="now add a regression test"),
        Message(role="user", content=SUMMARY_PREFIX + summary.summary),
        Message(role="user", content="continue"),
    ]
    # The oracle: the engine's prompt is a full render of the kept items, the summary as a user message.
    assert request.prompt is not None
    assert list(request.prompt.tokens()) == list(renderer.prompt(renderer.render_full("Be brief.", request.tools, kept)))
    # A continuation of it appends (the compaction item stays in the stored conversation).
    before = renderer.stats.items_rendered
    again = client.responses.create(model=MODEL, input="and then?", previous_response_id=follow.id, instructions="Be brief.")
    assert again.usage is not None and again.usage.input_tokens_details.cached_tokens > 0
    assert renderer.stats.items_rendered - before <= 2


def _hosted(item: dict[str, Any]) -> Any:
    from responses_cache.protocol.request import decode_item

    return decode_item(json.dumps(item).encode(), 0)


def _refused(server: Any, item: dict[str, Any], key: str = "sk-a") -> dict[str, Any]:
    answer = httpx.post(
        f"{server.http_url}/responses",
        json={"model": MODEL, "input": [{"role": "user", "content": "hi"}, item, {"role": "user", "content": "go on"}]},
        headers={"authorization": f"Bearer {key}"}, timeout=30,
    )
    assert answer.status_code == 400, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["param"] == "input[1].encrypted_content"
    return error


def test_tampered_foreign_tenant_and_expired_items_are_refused(setup: Any, sealer: Sealer) -> None:
    server, _, _ = setup
    raw = _compact_raw(server, {"input": "summarize me", "instructions": "Be brief."}).json()
    item = raw["output"][-1]
    blob = item["encrypted_content"]
    tampered = {**item, "encrypted_content": blob[:-6] + ("AAAAAA" if not blob.endswith("AAAAAA") else "BBBBBB")}
    error = _refused(server, tampered)
    assert error["code"] == "invalid_encrypted_content" and "could not be verified" in error["message"]
    assert item["id"] in error["message"]
    # Another tenant's server-made item does not open for this one.
    assert _refused(server, item, key="sk-b")["code"] == "invalid_encrypted_content"
    # Sealed for this tenant, but long expired.
    expired = compaction.seal(sealer, "tenant-a", "old summary", ttl_s=60, now=1_000_000.0)
    error = _refused(server, {"type": "compaction", "id": expired.id, "encrypted_content": expired.encrypted_content})
    assert error["code"] == "invalid_encrypted_content" and "expired" in error["message"]
    # Reasoning sealed by the same key does not open as a compaction (purpose-bound).
    payload = msgspec.msgpack.encode(["a summary", 1e12, False])  # would open, were it sealed as a compaction
    reasoning_blob = sealer.seal("tenant-a", "reasoning", payload)
    assert _refused(server, {"type": "compaction", "encrypted_content": reasoning_blob})["code"] == "invalid_encrypted_content"
    # And the owner still continues with it.
    ok = _client(server).responses.create(model=MODEL, input=[*raw["output"], {"role": "user", "content": "go on"}])
    assert ok.status == "completed"


def test_without_a_sealing_key_compaction_is_refused_clearly(responses_cache_server_factory: Any) -> None:
    server = responses_cache_server_factory()
    answer = _compact_raw(server, {"input": "hello"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "unsupported_value"
    item = {"type": "compaction", "encrypted_content": "rcs1.AAAA"}
    refused = httpx.post(f"{server.http_url}/responses", json={"model": MODEL, "input": [item]}, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input[0].encrypted_content"
    trigger = httpx.post(
        f"{server.http_url}/responses", timeout=30,
        json={"model": MODEL, "input": [{"role": "user", "content": "hi"}, {"type": "compaction_trigger"}]},
    )
    assert trigger.status_code == 400 and trigger.json()["error"]["param"] == "input[1].type"
    # ``context_management`` is accepted and does nothing (clients send it by default).
    managed = httpx.post(
        f"{server.http_url}/responses", timeout=30,
        json={"model": MODEL, "input": "hi", "context_management": [{"type": "compaction", "compact_threshold": 10}]},
    )
    assert managed.status_code == 200 and managed.json()["output"][0]["type"] == "message"


@pytest.mark.parametrize(
    ("entry", "param"),
    [
        ({"type": "summarize"}, "context_management[0].type"),
        ({"type": "compaction", "compact_threshold": 0}, "context_management[0].compact_threshold"),
        ({"type": "compaction", "compact_threshold": "big"}, "context_management[0].compact_threshold"),
    ],
)
def test_bad_context_management_is_a_400_naming_the_entry(setup: Any, entry: dict[str, Any], param: str) -> None:
    server, _, _ = setup
    with pytest.raises(openai.BadRequestError) as caught:
        _client(server).responses.create(model=MODEL, input="hi", context_management=[entry])  # type: ignore[list-item]
    assert caught.value.body["param"] == param  # type: ignore[index]


def test_truncation_over_http_reports_what_it_dropped(responses_cache_server_factory: Any) -> None:
    backend = RecordingBackend()
    server = responses_cache_server_factory(backend=backend, context_window=400)
    client = OpenAI(base_url=server.http_url, api_key="k", max_retries=0, _strict_response_validation=True)
    previous = None
    details = []
    for n in range(12):
        response = client.responses.create(
            model=MODEL, input=f"turn {n} " + "word " * 20, previous_response_id=previous, truncation="auto",
            max_output_tokens=40, instructions="Be brief.",
        )
        previous = response.id
        details.append(response.model_extra.get("truncation_details") if response.model_extra else None)
        assert response.usage is not None and response.usage.input_tokens + 40 <= 400
    cuts = [d for d in details if d is not None]
    assert cuts and all(d["dropped_items"] > 0 and d["dropped_tokens"] > 0 for d in cuts)
    assert details[0] is None  # a prompt that fits is not cut


def test_an_engine_that_writes_no_summary_fails_the_compaction_and_is_billed(
    responses_cache_server_factory: Any, sealer: Sealer
) -> None:
    from responses_cache.backends.base import EngineUsage, Finish
    from responses_cache.testing import ScriptedBackend

    usage = Usage()
    scripted = ScriptedBackend([[Finish(usage=EngineUsage(output_tokens=3))]])
    server = responses_cache_server_factory(backend=scripted, sealer=sealer, billing=usage)
    answer = _compact_raw(server, {"input": "look at parser.py"})
    assert answer.status_code == 500 and answer.json()["error"]["code"] == "server_error"
    assert "no summary" in answer.json()["error"]["message"]
    assert [r.output_tokens for r in usage.records] == [3]  # what the engine did is billed all the same
