"""Decoding the input items real clients send, and resolving ``item_reference`` (sans-I/O)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from responses_cache.protocol.codec import encode
from responses_cache.protocol.errors import ResponsesError
from responses_cache.protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    HostedItem,
    Item,
    ItemReference,
    Message,
)
from responses_cache.protocol.request import decode_input
from responses_cache.storage.references import ItemIndex, resolve_references
from responses_cache.tokens.key import render_key


def decode(items: list[dict[str, Any]]) -> list[Item]:
    return decode_input(json.dumps(items).encode())


def error_of(items: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    with pytest.raises(ResponsesError) as caught:
        decode(items)
    return caught.value.payload.code, caught.value.payload.param


def test_custom_tool_items_decode() -> None:
    call, output = decode(
        [
            {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "*** Begin Patch", "id": "ctc_1"},
            {"type": "custom_tool_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "ok"}]},
        ]
    )
    assert isinstance(call, CustomToolCall) and call.input == "*** Begin Patch"
    assert isinstance(output, CustomToolCallOutput)
    assert render_key(output)[0] == "custom_tool_call_output"
    assert error_of([{"type": "custom_tool_call", "call_id": "c", "name": "x"}]) == ("missing_required_parameter", "input[0].input")


def test_item_reference_with_or_without_type() -> None:
    assert decode([{"type": "item_reference", "id": "msg_1"}, {"id": "msg_2"}]) == [ItemReference("msg_1"), ItemReference("msg_2")]
    assert decode([{"id": "msg_3", "role": "user", "content": "hi"}]) == [Message(role="user", content="hi", id="msg_3")]
    assert error_of([{"type": "item_reference", "id": 5}])[1] == "input[0].id"


def test_hosted_items_are_kept_as_sent() -> None:
    raw = b'{"type":"mcp_call","id":"mcp_1","name":"ask","server_label":"wiki","arguments":"{}","output":"42","x":1.50}'
    (item,) = decode_input(b"[" + raw + b"]")
    assert isinstance(item, HostedItem) and item.type == "mcp_call" and item.id == "mcp_1"
    assert encode([item]) == b"[" + raw + b"]"
    assert error_of([{"type": "compaction"}]) == ("missing_required_parameter", "input[0].encrypted_content")
    assert error_of([{"type": "web_search_call", "id": 7, "status": "completed", "action": {}}]) == ("invalid_type", "input[0].id")
    code, param = error_of([{"type": "additional_tools"}])
    assert (code, param) == ("invalid_value", "input[0].type")


def test_index_is_bounded_and_tenant_scoped() -> None:
    index = ItemIndex(2)
    index.add("a", [Message(role="user", content="1", id="m1"), Message(role="user", content="2", id="m2")])
    index.add("a", [Message(role="user", content="3", id="m3"), Message(role="user", content="no id")])
    assert len(index) == 2 and index.get("a", "m1") is None and index.get("a", "m3") is not None
    assert index.get("b", "m3") is None
    assert index.nbytes == 0  # bounded by count

    by_bytes = ItemIndex(100, max_bytes=400)
    big = Message(role="user", content="x" * 1000, id="big")
    by_bytes.add("a", [Message(role="user", content="small", id="s1"), big])
    assert by_bytes.get("a", "big") is None and by_bytes.get("a", "s1") is not None  # too large alone
    by_bytes.add("a", [Message(role="user", content="y" * 150, id=f"m{i}") for i in range(3)])
    assert 0 < by_bytes.nbytes <= 400 and by_bytes.get("a", "s1") is None and by_bytes.get("a", "m2") is not None


def test_resolution_order_and_errors() -> None:
    connection = ItemIndex(10)
    mine = Message(role="assistant", content="from the connection", id="msg_c")
    connection.add("t", [mine])
    earlier = Message(role="user", content="earlier in this input", id="msg_e")
    items: list[Item] = [earlier, ItemReference("msg_e"), ItemReference("msg_c")]

    async def run(items: list[Item], tenant: str = "t", pass_through: bool = False) -> list[Item]:
        return await resolve_references(
            items, tenant, connection=connection, process=None, store=None, parent=None, pass_through=pass_through
        )

    assert asyncio.run(run(items)) == [earlier, earlier, mine]
    with pytest.raises(ResponsesError) as caught:
        asyncio.run(run(items, tenant="other"))
    assert (caught.value.payload.code, caught.value.payload.param) == ("item_not_found", "input[2].id")
    assert asyncio.run(run([ItemReference("zz")], pass_through=True)) == [ItemReference("zz")]
    plain: list[Item] = [earlier]
    assert asyncio.run(run(plain)) is plain  # nothing to resolve: no copy


def test_many_references_cost_one_store_read_per_stored_response() -> None:
    from responses_cache.protocol.response import Response
    from responses_cache.storage.store import MemoryResponseStore, StoredResponse

    class CountingStore(MemoryResponseStore):
        reads = 0

        async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
            CountingStore.reads += 1
            return await super().get(tenant, response_id)

    store = CountingStore()
    inputs = [Message(role="user", content=str(i), id=f"msg_{i}") for i in range(50)]
    response = Response(
        id="resp_1", created_at=0, status="completed", model="m", output=[], tools=[], tool_choice="auto", parallel_tool_calls=True
    )
    asyncio.run(store.put(StoredResponse("t", response, tuple(inputs), None, b"[]")))
    process = ItemIndex(1000)
    process.add("t", inputs, "resp_1")
    refs: list[Item] = [ItemReference(f"msg_{i}") for i in range(50)]
    resolved = asyncio.run(resolve_references(refs, "t", connection=None, process=process, store=store, parent=None))
    assert resolved == inputs and CountingStore.reads == 1
