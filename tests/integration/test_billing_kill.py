"""``responses-cache serve`` killed with SIGKILL under load loses no usage record.

Several WebSocket clients (one of them hanging up mid-stream now and then) drive a real server
process with a write-ahead journal; the test SIGKILLs it, restarts it on the same journal and
checks, for every response id any client saw ``response.created`` for: exactly one record;
a completed response's record carries the usage of its ``response.completed``; a response the
client never saw finish is ``cancelled`` (rebuilt from the journal, or cancelled by the hang-up).
Once with the sink up (a JSONL file), once during a webhook outage (a loopback webhook that
answers 503 until the restart).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

from responses_cache.testing import (
    ServeProcess,
    WebhookReceiver,
    free_port,
    serve_in_process,
    wait_for,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

#: Long enough answers that responses are mid-stream (past a progress mark) when the kill lands.
ENGINE = json.dumps({"answer_tokens": 600, "output_tokens_per_s": 6000})
CLIENTS = 6


def _serve(*args: str) -> ServeProcess:
    return serve_in_process(*args, env={**os.environ, "RESPONSES_CACHE_BACKEND_OPTIONS": ENGINE})


@dataclass
class Seen:
    created: set[str] = field(default_factory=set)
    completed: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Why each client that stopped stopped (before the kill, a failure of the test).
    errors: list[str] = field(default_factory=list)


def _client(port: int, seen: Seen, stop: threading.Event, hang_up: bool) -> None:
    """Turns back to back; with ``hang_up``, every other turn is abandoned mid-stream."""
    turn = 0
    while not stop.is_set():
        try:
            with connect(f"ws://127.0.0.1:{port}/v1/responses", max_size=None, open_timeout=5, close_timeout=0.5) as ws:
                previous = None
                while not stop.is_set():
                    turn += 1
                    ws.send(json.dumps({"type": "response.create", "model": "sim-1", "input": f"turn {turn}",
                                        "previous_response_id": previous}))
                    deltas = 0
                    while True:
                        event = json.loads(ws.recv(timeout=30))
                        kind = event["type"]
                        if kind == "response.created":
                            with seen.lock:
                                seen.created.add(event["response"]["id"])
                        elif kind == "response.output_text.delta":
                            deltas += 1
                            if hang_up and turn % 2 == 0 and deltas == 50:
                                break
                        elif kind == "response.completed":
                            with seen.lock:
                                seen.completed[event["response"]["id"]] = event["response"]["usage"]
                            previous = event["response"]["id"]
                            break
                        elif kind in ("response.failed", "response.incomplete", "error"):
                            raise AssertionError(f"unexpected {kind}: {event}")
                    if hang_up and deltas == 50:
                        break  # close the socket mid-stream: the server bills it as cancelled
        except Exception as exc:
            seen.errors.append(f"{type(exc).__name__}: {exc}")
            return  # the server was killed (before that, a dead client fails the test)


def _load_then_kill(server: ServeProcess, count: int) -> Seen:
    seen = Seen()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_client, args=(server.port, seen, stop, i == 0), daemon=True) for i in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while len(seen.created) < count:
            assert time.monotonic() < deadline, "load did not get going"
            assert all(t.is_alive() for t in threads[1:]), f"a client failed: {seen.errors}"
            time.sleep(0.005)
    finally:
        server.kill()  # the crash under test, or the end of a failed test: no server outlives it
        stop.set()
        for t in threads:
            t.join(10)
    return seen


def _check(seen: Seen, records: dict[str, list[dict[str, Any]]]) -> None:
    missing = seen.created - set(records)
    assert not missing, f"{len(missing)} of {len(seen.created)} announced responses have no record"
    for rid in seen.created:
        copies = records[rid]
        # Delivered at least once; a repeat (an ack lost to the kill) is the very same record.
        assert all(c == copies[0] for c in copies), copies
    recovered = 0
    for rid in seen.created:
        record = records[rid][0]
        usage = seen.completed.get(rid)
        if usage is not None:
            assert record["status"] == "completed" and not record["recovered"]
            assert record["input_tokens"] == usage["input_tokens"]
            assert record["cached_tokens"] == usage["input_tokens_details"]["cached_tokens"]
            assert record["output_tokens"] == usage["output_tokens"]
            assert record["reasoning_tokens"] == usage["output_tokens_details"]["reasoning_tokens"]
        elif record["recovered"]:
            recovered += 1
            assert record["status"] == "cancelled" and record["input_tokens"] > 0
        else:
            # Cancelled by a hang-up, or its close entry was written just before the kill and
            # response.completed never left the process.
            assert record["status"] in ("cancelled", "completed")
    assert recovered > 0  # the kill did cut responses mid-stream, and they were billed


def test_sigkill_with_the_sink_up_loses_no_record(tmp_path: Path) -> None:
    ledger, journal = tmp_path / "usage.jsonl", tmp_path / "billing.journal"
    args = ("--billing-jsonl", str(ledger), "--billing-journal", str(journal))
    seen = _load_then_kill(_serve(*args), 100)

    def ledger_records() -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        if ledger.exists():
            for line in ledger.read_text().splitlines():
                if line.endswith("}"):
                    record = json.loads(line)
                    out.setdefault(record["response_id"], []).append(record)
        return out

    with _serve(*args):
        wait_for(lambda: seen.created <= set(ledger_records()), "records were not delivered after the restart", 30)
    records = ledger_records()
    assert all(len(v) == 1 for v in records.values())  # the JSONL sink dedupes across restarts
    _check(seen, records)


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    with WebhookReceiver("/usage") as receiver:
        receiver.down = True  # an outage from the start
        yield receiver


def test_sigkill_during_a_webhook_outage_loses_no_record(tmp_path: Path, webhook: WebhookReceiver) -> None:
    journal = tmp_path / "billing.journal"
    args = ("--billing-webhook", webhook.url, "--billing-journal", str(journal))
    seen = _load_then_kill(_serve(*args), 100)
    assert webhook.failures > 0 and not webhook.received  # the outage was real
    with webhook.lock:
        webhook.down = False
    with _serve(*args):
        wait_for(lambda: seen.created <= set(webhook.received), "records were not delivered after the restart", 30)
    _check(seen, webhook.received)


def test_a_second_server_on_the_same_journal_is_refused(tmp_path: Path) -> None:
    args = ("--billing-jsonl", str(tmp_path / "usage.jsonl"), "--billing-journal", str(tmp_path / "j"))
    with _serve(*args):
        second = subprocess.run(
            [sys.executable, "-m", "responses_cache.server.cli", "serve", "--port", str(free_port()), *args],
            capture_output=True, text=True, timeout=30,
        )
        assert second.returncode == 2
        assert "in use by another process" in second.stderr
