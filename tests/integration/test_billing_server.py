"""Billing through the real server: overlapped with the turn, partial usage on disconnect, and
nothing lost when the server process gets SIGTERM under load."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

from responses_cache import Biller, CallableSink, SimulatedConfig, SimulatedEngine, UsageRecord
from responses_cache.testing import serve_in_process


class GatedSink:
    """A sink whose writes block until the test opens the gate (a very slow sink)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.writing = threading.Event()
        self.records: list[UsageRecord] = []

    async def write(self, records: Any) -> None:
        self.writing.set()
        while not self.gate.is_set():
            await asyncio.sleep(0.005)
        self.records.extend(records)

    async def close(self) -> None:
        pass


def _never_finishing() -> SimulatedEngine:
    """A paced engine whose clock stands still: token i waits i/200 s, so it keeps streaming
    while the client leaves and would need over six minutes to reach its 400th token. A
    disconnect can only find it mid-answer (nothing is timed)."""
    return SimulatedEngine(SimulatedConfig(output_tokens_per_s=200, answer_tokens=400), clock=lambda: 0.0)


def _recv_until(ws: Any, *types: str) -> dict[str, Any]:
    while True:
        event = json.loads(ws.recv(timeout=30))
        if event["type"] in types:
            return dict(event)


def test_completed_reaches_client_before_slow_sink_records(responses_cache_server_factory: Any) -> None:
    sink = GatedSink()
    biller = Biller(sink, flush_interval=0.001)
    server = responses_cache_server_factory(billing=biller)
    with connect(server.ws_url, max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "sim-1", "input": "hi"}))
        first = _recv_until(ws, "response.completed")
        assert sink.writing.wait(5)  # the sink is busy with the first record …
        ws.send(json.dumps({"type": "response.create", "model": "sim-1", "input": "again",
                            "previous_response_id": first["response"]["id"]}))
        second = _recv_until(ws, "response.completed")  # … and the next turn completes anyway
        assert sink.records == []
    sink.gate.set()
    deadline = time.monotonic() + 5
    while len(sink.records) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    by_id = {r.response_id: r for r in sink.records}
    assert set(by_id) == {first["response"]["id"], second["response"]["id"]}
    record = by_id[second["response"]["id"]]
    usage = second["response"]["usage"]
    assert record.status == "completed" and record.transport == "websocket"
    assert record.input_tokens == usage["input_tokens"] and record.output_tokens == usage["output_tokens"]
    assert record.cached_tokens == usage["input_tokens_details"]["cached_tokens"] > 0
    assert record.previous_response_id == first["response"]["id"]


def test_disconnect_mid_stream_bills_partial_usage(responses_cache_server_factory: Any) -> None:
    records: list[UsageRecord] = []
    biller = Biller(CallableSink(records.extend), flush_interval=0.001)
    engine = _never_finishing()
    server = responses_cache_server_factory(backend=engine, billing=biller)
    with connect(server.ws_url, max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "sim-1", "input": "write a lot"}))
        created = _recv_until(ws, "response.created")
        for _ in range(5):
            _recv_until(ws, "response.output_text.delta")
    deadline = time.monotonic() + 10
    while not records and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(records) == 1
    record = records[0]
    assert record.response_id == created["response"]["id"]
    assert record.status == "cancelled"
    assert 5 <= record.output_tokens < 400 and record.input_tokens > 0


@pytest.mark.subprocess
def test_sigterm_under_load_loses_no_record(tmp_path: Path) -> None:
    ledger, journal = tmp_path / "usage.jsonl", tmp_path / "billing.journal"
    served = serve_in_process("--instant", "--billing-jsonl", str(ledger), "--billing-journal", str(journal))
    server, port = served.proc, served.port
    try:
        seen: set[str] = set()
        lock = threading.Lock()
        stop = threading.Event()
        terminated = threading.Event()
        errors: list[BaseException] = []

        def client() -> None:
            try:
                with connect(f"ws://127.0.0.1:{port}/v1/responses", max_size=None) as ws:
                    previous = None
                    while not stop.is_set():
                        ws.send(json.dumps({"type": "response.create", "model": "sim-1", "input": "go",
                                            "previous_response_id": previous}))
                        while True:
                            event = json.loads(ws.recv(timeout=30))
                            if event["type"] == "response.created":
                                with lock:
                                    seen.add(event["response"]["id"])
                            if event["type"] in ("response.completed", "response.failed", "error"):
                                previous = event.get("response", {}).get("id")
                                break
            except Exception as exc:
                if not terminated.is_set():  # after SIGTERM the server going away is expected
                    errors.append(exc)

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(seen) < 200:
            assert not errors, errors
            assert time.monotonic() < deadline, f"only {len(seen)} responses started"
            time.sleep(0.01)
        terminated.set()
        server.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully (lifespan stops the biller), then re-raises the signal.
        assert server.wait(30) in (0, -signal.SIGTERM)
        stop.set()
        for t in threads:
            t.join(10)
    finally:
        served.kill()  # (it has ended already when the test got this far)
    billed = [json.loads(line)["response_id"] for line in ledger.read_text().splitlines()]
    assert len(billed) == len(set(billed))  # once per response id
    assert seen <= set(billed), f"{len(seen - set(billed))} responses were not billed"


def test_http_stream_disconnect_cancels_generation_and_bills_partial_usage(responses_cache_server_factory: Any) -> None:
    import httpx

    records: list[UsageRecord] = []
    biller = Biller(CallableSink(records.extend), flush_interval=0.001)
    engine = _never_finishing()
    server = responses_cache_server_factory(backend=engine, billing=biller)
    body = {"model": "sim-1", "input": "write a lot", "stream": True}
    with httpx.stream("POST", f"{server.http_url}/responses", json=body) as response:
        deltas = 0
        for line in response.iter_lines():
            if line.startswith("data:") and '"response.output_text.delta"' in line:
                deltas += 1
                if deltas == 5:
                    break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 10
    while not records and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(records) == 1
    record = records[0]
    assert record.status == "cancelled" and record.transport == "http"
    assert 5 <= record.output_tokens < 400
