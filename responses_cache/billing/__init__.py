"""Overlapped, loss-free async billing.

Turn code calls :meth:`Biller.submit` with one :class:`UsageRecord` per finished or cancelled
response and moves on; a single background worker batches records into a
:class:`BillingSink`, spilling to a local write-ahead file while the sink is down and replaying
it when the sink (or the next process) comes back. See ``docs/billing.md``.
"""

from .biller import Biller, BillerStats
from .record import (
    UsageRecord,
    UsageStatus,
    decode_record,
    decode_records,
    encode_jsonl,
    encode_record,
    encode_records,
)
from .sinks import (
    BillingSink,
    CallableSink,
    JsonlSink,
    RecordsCallback,
    SqliteSink,
    WebhookError,
    WebhookSink,
)
from .spill import SpillBatch, SpillFile, SpillFileLocked

__all__ = [
    "Biller",
    "BillerStats",
    "BillingSink",
    "CallableSink",
    "JsonlSink",
    "RecordsCallback",
    "SpillBatch",
    "SpillFile",
    "SpillFileLocked",
    "SqliteSink",
    "UsageRecord",
    "UsageStatus",
    "WebhookError",
    "WebhookSink",
    "decode_record",
    "decode_records",
    "encode_jsonl",
    "encode_record",
    "encode_records",
]
