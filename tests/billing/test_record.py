from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from responses_cache.billing import (
    UsageRecord,
    decode_record,
    decode_records,
    encode_jsonl,
    encode_record,
    encode_records,
)

from .conftest import make_record

records = st.builds(
    lambda rid, tenant, inp, cached, out, reasoning, t, status, transport, prev: UsageRecord(
        response_id=rid,
        tenant=tenant,
        model="m",
        route="r",
        status=status,
        input_tokens=inp + cached,
        cached_tokens=cached,
        output_tokens=out + reasoning,
        reasoning_tokens=reasoning,
        created_at=t,
        finished_at=t + 1.5,
        transport=transport,
        previous_response_id=prev,
    ),
    st.text(min_size=1),
    st.text(),
    st.integers(0, 10**9),
    st.integers(0, 10**9),
    st.integers(0, 10**9),
    st.integers(0, 10**9),
    st.floats(0, 4e9, allow_nan=False),
    st.sampled_from(["completed", "incomplete", "failed", "cancelled"]),
    st.sampled_from(["http", "websocket"]),
    st.none() | st.text(min_size=1),
)


@settings(derandomize=True, deadline=None)  # a property of the codec, not of its speed (a loaded machine)
@given(records)
def test_json_roundtrip(record: UsageRecord) -> None:
    assert decode_record(encode_record(record)) == record
    assert decode_records(encode_records([record, record])) == [record, record]


@settings(derandomize=True, deadline=None)  # a property of the codec, not of its speed (a loaded machine)
@given(st.lists(records, max_size=5))
def test_jsonl_is_one_line_per_record(batch: list[UsageRecord]) -> None:
    data = encode_jsonl(batch)
    lines = data.split(b"\n")
    assert lines[-1] == b""
    assert [decode_record(line) for line in lines[:-1]] == batch


def test_defaults_and_field_names() -> None:
    record = UsageRecord(
        response_id="resp_1",
        tenant="t",
        model="m",
        route="r",
        status="completed",
        input_tokens=10,
        cached_tokens=4,
        output_tokens=3,
        reasoning_tokens=1,
        created_at=1.0,
        finished_at=2.0,
    )
    assert record.transport == "http"
    assert record.previous_response_id is None
    assert record.total_tokens == 13
    assert set(msgspec.json.decode(encode_record(record))) == set(UsageRecord.__struct_fields__)


def test_records_are_frozen() -> None:
    record = make_record(1)
    with pytest.raises(AttributeError):
        record.input_tokens = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "overrides",
    [
        {"input_tokens": -1, "cached_tokens": 0},
        {"output_tokens": -1, "reasoning_tokens": 0},
        {"cached_tokens": 500, "input_tokens": 10},
        {"reasoning_tokens": 21, "output_tokens": 20},
    ],
)
def test_invalid_token_counts_are_rejected(overrides: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        make_record(1, **overrides)
    good = msgspec.json.decode(encode_record(make_record(1)))
    good.update(overrides)
    with pytest.raises(msgspec.ValidationError):
        decode_record(msgspec.json.encode(good))


def test_unknown_status_is_rejected_on_decode() -> None:
    raw = msgspec.json.decode(encode_record(make_record(1)))
    raw["status"] = "exploded"
    with pytest.raises(msgspec.ValidationError):
        decode_record(msgspec.json.encode(raw))
