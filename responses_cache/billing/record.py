"""The usage record: one per finished (or cancelled) response, and its wire encoding.

Records are immutable msgspec Structs. The JSON encoder and decoders are built once at import
time and shared by the journal and every sink, so a record looks the same everywhere it is
written: one JSON object with the field names below.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

__all__ = [
    "UsageRecord",
    "UsageStatus",
    "decode_record",
    "decode_records",
    "encode_jsonl",
    "encode_record",
    "encode_records",
]

UsageStatus = Literal["completed", "incomplete", "failed", "cancelled"]

_TOKEN_FIELDS = ("input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens")


class UsageRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Usage of one response, as billed.

    Token accounting follows the OpenAI ``usage`` object: ``cached_tokens`` is the part of
    ``input_tokens`` served from a reused prefix, and ``reasoning_tokens`` is the part of
    ``output_tokens`` spent on reasoning. Both invariants (and non-negative counts) are checked
    when a record is built and when one is decoded, so a bad record fails at its producer rather
    than inside the billing pipeline.
    """

    response_id: str
    tenant: str
    model: str
    route: str
    status: UsageStatus
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int
    created_at: float
    """Unix seconds at which the response was created."""
    finished_at: float
    """Unix seconds at which the response finished (or was cancelled)."""
    transport: str = "http"
    """``"http"`` or ``"websocket"``."""
    previous_response_id: str | None = None
    recovered: bool = False
    """``True`` for a ``cancelled`` record rebuilt from the journal after a crash: the process
    died mid-response, and the usage is that of the response's last progress mark."""

    def __post_init__(self) -> None:
        for name in _TOKEN_FIELDS:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.cached_tokens > self.input_tokens:
            raise ValueError("cached_tokens must not exceed input_tokens")
        if self.reasoning_tokens > self.output_tokens:
            raise ValueError("reasoning_tokens must not exceed output_tokens")

    @property
    def total_tokens(self) -> int:
        """``input_tokens + output_tokens``."""
        return self.input_tokens + self.output_tokens


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(UsageRecord)
_list_decoder = msgspec.json.Decoder(list[UsageRecord])


def encode_record(record: UsageRecord) -> bytes:
    """One record as a JSON object (no trailing newline)."""
    return _encoder.encode(record)


def decode_record(data: bytes | str) -> UsageRecord:
    """Decode one JSON object; raises ``msgspec.ValidationError``/``DecodeError`` if invalid."""
    return _decoder.decode(data)


def encode_records(records: Iterable[UsageRecord]) -> bytes:
    """Records as one JSON array (the webhook body)."""
    return _encoder.encode(list(records))


def decode_records(data: bytes | str) -> list[UsageRecord]:
    """Decode a JSON array of records."""
    return _list_decoder.decode(data)


def encode_jsonl(records: Iterable[UsageRecord]) -> bytes:
    """Records as JSON Lines: one object per line, each line ending in ``\\n``."""
    return _encoder.encode_lines(list(records))
