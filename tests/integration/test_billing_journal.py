"""The journal through the real server: a response's open entry is in the journal before the
client sees ``response.created``, progress marks follow its output, and its close entry (with
the usage of ``response.completed``) is there before the client sees ``response.completed``.
In machine mode both are on disk (``fdatasync``) by then."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_billing_server import GatedSink
from websockets.sync.client import connect

from responses_cache import Biller, SimulatedConfig, SimulatedEngine
from responses_cache.billing import CallableSink, MarkEntry, OpenEntry, UsageRecord
from responses_cache.billing.journal import AckEntry, CloseEntry
from responses_cache.testing import wait_for

_decoder = msgspec.json.Decoder(OpenEntry | MarkEntry | CloseEntry | AckEntry)


def _entries(path: Path) -> list[Any]:
    return [_decoder.decode(line) for line in path.read_bytes().splitlines() if line]


@pytest.mark.parametrize("durability", ["process", "machine"])
def test_journal_entries_precede_the_events(responses_cache_server_factory: Any, tmp_path: Path, durability: str) -> None:
    journal_path = tmp_path / "billing.journal"
    records: list[UsageRecord] = []
    biller = Biller(CallableSink(records.extend), journal_path=journal_path, durability=durability)  # type: ignore[arg-type]
    engine = SimulatedEngine(SimulatedConfig(output_tokens_per_s=20_000, answer_tokens=1200))
    server = responses_cache_server_factory(backend=engine, billing=biller)
    journal = biller.journal
    assert journal is not None
    with connect(server.ws_url, max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "sim-1", "input": "write a lot"}))
        while True:
            event = json.loads(ws.recv(timeout=30))
            if event["type"] == "response.created":
                rid = event["response"]["id"]
                opens = [e for e in _entries(journal_path) if isinstance(e, OpenEntry)]
                assert [e.id for e in opens] == [rid]
                assert opens[0].input_tokens > 0 and opens[0].transport == "websocket"
                if durability == "machine":
                    assert journal.synced >= journal_path.stat().st_size  # on disk, not just written
            elif event["type"] == "response.completed":
                entries = _entries(journal_path)
                closes = [e.record for e in entries if isinstance(e, CloseEntry)]
                assert [c.response_id for c in closes] == [rid]
                usage = event["response"]["usage"]
                close = closes[0]
                assert close.status == "completed" and not close.recovered
                assert (close.input_tokens, close.output_tokens) == (usage["input_tokens"], usage["output_tokens"])
                assert close.input_tokens == opens[0].input_tokens
                marks = [e.output_tokens for e in entries if isinstance(e, MarkEntry)]
                assert len(marks) >= 2 and marks == sorted(marks) and marks[-1] <= close.output_tokens
                if durability == "machine":
                    closed_at = journal_path.read_bytes().index(b'"t":"close"')
                    assert journal.synced > closed_at
                break


def test_a_turn_without_a_journal_still_bills(responses_cache_server_factory: Any) -> None:
    records: list[UsageRecord] = []
    biller = Biller(CallableSink(records.extend), flush_interval=0.001)
    server = responses_cache_server_factory(billing=biller)
    with connect(server.ws_url, max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "sim-1", "input": "hi"}))
        while json.loads(ws.recv(timeout=30))["type"] != "response.completed":
            pass
    server.stop()
    assert [r.status for r in records] == ["completed"]


def test_a_cancelled_response_is_closed_in_the_journal(responses_cache_server_factory: Any, tmp_path: Path) -> None:
    """A client that leaves mid-answer cancels its response: the close entry (status
    ``cancelled``, the partial usage) goes to the journal as a completed response's does, not
    only to memory, so a crash after the disconnect bills what the response used. (The sink is
    held shut, so nothing is acknowledged and truncated away meanwhile.)"""
    journal_path = tmp_path / "billing.journal"
    sink = GatedSink()
    biller = Biller(sink, journal_path=journal_path, flush_interval=0.001)
    # A paced engine whose clock stands still: it is mid-answer whenever the client leaves.
    engine = SimulatedEngine(SimulatedConfig(output_tokens_per_s=200, answer_tokens=400), clock=lambda: 0.0)
    server = responses_cache_server_factory(backend=engine, billing=biller)
    try:
        with connect(server.ws_url, max_size=None) as ws:
            ws.send(json.dumps({"type": "response.create", "model": "sim-1", "input": "write a lot"}))
            rid, deltas = None, 0
            while deltas < 5:
                event = json.loads(ws.recv(timeout=30))
                if event["type"] == "response.created":
                    rid = event["response"]["id"]
                deltas += event["type"] == "response.output_text.delta"
        wait_for(lambda: any(isinstance(e, CloseEntry) for e in _entries(journal_path)), "the cancelled response's close entry")
        closes = [e.record for e in _entries(journal_path) if isinstance(e, CloseEntry)]
        assert [(c.response_id, c.status, c.recovered) for c in closes] == [(rid, "cancelled", False)]
        assert 5 <= closes[0].output_tokens < 400 and closes[0].input_tokens > 0
        assert biller.stats().in_memory == 0
    finally:
        sink.gate.set()
