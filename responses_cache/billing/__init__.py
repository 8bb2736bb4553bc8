"""Overlapped, loss-free async billing through a write-ahead usage journal.

Turn code tells a :class:`Biller` when a response begins, how far it got (progress marks) and
its final :class:`UsageRecord`; each is one append to a local :class:`UsageJournal`. A single
background worker delivers closed records from the journal to a :class:`BillingSink` in
batches and checkpoints what the sink accepted. After a crash, the next start delivers what was
not acknowledged and bills responses cut off mid-stream as ``cancelled``. See
``docs/billing.md``.
"""

from .biller import Biller, BillerStats
from .journal import Durability, JournalBatch, JournalLocked, MarkEntry, OpenEntry, UsageJournal
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

__all__ = [
    "Biller",
    "BillerStats",
    "BillingSink",
    "CallableSink",
    "Durability",
    "JournalBatch",
    "JournalLocked",
    "JsonlSink",
    "MarkEntry",
    "OpenEntry",
    "RecordsCallback",
    "SqliteSink",
    "UsageJournal",
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
