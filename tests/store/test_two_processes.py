"""Done-when of the scaling work: two ``responses-cache serve`` processes share one Redis.

A ``store: true`` WebSocket conversation started on one process continues on the other after a
reconnect, and over HTTP on either; each time, what the engine receives equals one request that
carries the whole conversation (instructions, tools, every item, and the very same prompt
tokens). Tenants stay isolated and an expired entry is ``previous_response_not_found``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from benchmarks.suite.server import stop_process

SCRIPT = Path(__file__).with_name("recording_serve.py")
ALICE, BOB = "sk-alice", "sk-bob"
MODEL = "sim-1"


@dataclass
class Process:
    port: int
    record: Path
    proc: subprocess.Popen[bytes]

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    def requests(self) -> dict[str, dict[str, Any]]:
        """What the engine was given, by response id."""
        if not self.record.exists():
            return {}
        lines = [json.loads(line) for line in self.record.read_text().splitlines()]
        return {r["response_id"]: r for r in lines}


SEALING_KEY = base64.b64encode(bytes(range(32))).decode()


def _start(tmp: Path, name: str, store: str) -> Process:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    record = tmp / f"{name}.jsonl"
    # Processes sharing a store share one sealing key (serve refuses to start without it).
    env = {**os.environ, "RECORD_PATH": str(record), "RESPONSES_CACHE_SEALING_KEY": SEALING_KEY}
    log = tmp / f"{name}.log"
    with log.open("wb") as err:  # a file, not a pipe: a chatty server never blocks on it
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "serve", "--port", str(port), "--store", store,
             "--api-key", ALICE, "--api-key", BOB, "--instant", "--prometheus"],
            env=env, stdout=subprocess.DEVNULL, stderr=err,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=_auth(ALICE), timeout=1).status_code == 200:
                return Process(port, record, proc)
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("serve did not start")


@pytest.fixture
def pair(tmp_path: Path, redis_url: str) -> Iterator[tuple[Process, Process]]:
    a = _start(tmp_path, "a", redis_url)
    try:
        b = _start(tmp_path, "b", redis_url)
    except BaseException:
        stop_process(a.proc)
        raise
    try:
        yield a, b
    finally:
        for p in (a, b):
            stop_process(p.proc, 15)


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


TOOLS = [{"type": "function", "name": "lookup", "description": "Look a thing up.",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]
INSTRUCTIONS = "You are terse."


def _body(input_: Any, previous: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "input": input_, "store": True, "instructions": INSTRUCTIONS, "tools": TOOLS}
    if previous is not None:
        body["previous_response_id"] = previous
    return body


def ws_turns(url: str, key: str, turns: list[tuple[str, str | None]]) -> list[dict[str, Any]]:
    """Send each ``(text, previous)`` (``None``: continue from the last) on one connection; the
    terminal events, in order."""
    out: list[dict[str, Any]] = []
    with connect(url, additional_headers=_auth(key)) as ws:
        previous: str | None = None
        for text, explicit in turns:
            prev = explicit if explicit is not None else previous
            ws.send(_encode({"type": "response.create", **_body(text, prev)}).decode())
            while True:
                event = json.loads(ws.recv(timeout=30))
                if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
                    break
            out.append(event)
            if event["type"] == "response.completed":
                previous = event["response"]["id"]
    return out


def http_turn(base: str, key: str, text: str, previous: str | None) -> httpx.Response:
    return httpx.post(
        f"{base}/responses", content=_encode(_body(text, previous)),
        headers={**_auth(key), "content-type": "application/json"}, timeout=30,
    )


def _encode(body: dict[str, Any]) -> bytes:
    """One serialization for every request (the tools' fingerprint is over their exact bytes)."""
    return json.dumps(body, separators=(",", ":")).encode()


def _resolved(process: Process) -> dict[tuple[str, str], int]:
    """``responses_cache_resolved_<tier>_total{transport=...}`` from the process's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{process.port}/metrics", timeout=10).text
    out: dict[tuple[str, str], int] = {}
    for match in re.finditer(r'^responses_cache_resolved_(\w+)_total\{transport="(\w+)"\} (\S+)$', text, re.M):
        if float(match[3]):
            out[(match[1], match[2])] = int(float(match[3]))
    return out


def _item(item: dict[str, Any]) -> dict[str, Any]:
    """A response output item as the client sends it back as input (ids and status dropped)."""
    return {k: v for k, v in item.items() if k not in ("id", "status")}


def test_one_conversation_across_two_processes(pair: tuple[Process, Process], redis_admin: Any) -> None:
    a, b = pair
    transcript: list[dict[str, Any]] = []  # the whole conversation, as one request would carry it

    def turn_done(process: Process, text: str, response: dict[str, Any]) -> None:
        """The engine saw what a fresh request carrying the whole transcript makes it see."""
        seen = process.requests()[response["id"]]
        whole = [*transcript, {"role": "user", "content": text}]
        one_request = httpx.post(
            f"{process.http}/responses", content=_encode({**_body(whole), "store": False}),
            headers={**_auth(ALICE), "content-type": "application/json"}, timeout=30,
        )
        assert one_request.status_code == 200, one_request.text
        reference = process.requests()[one_request.json()["id"]]
        assert len(seen["items"]) == len(whole)
        for key in ("instructions", "tools", "items", "prompt"):
            assert seen[key] == reference[key], key
        transcript.extend([{"role": "user", "content": text}, *(_item(i) for i in response["output"])])

    # 1. A WebSocket conversation on A.
    first, second = ws_turns(a.ws, ALICE, [("Hello there.", None), ("Tell me more.", None)])
    assert first["type"] == second["type"] == "response.completed"
    turn_done(a, "Hello there.", first["response"])
    turn_done(a, "Tell me more.", second["response"])

    # 2. The client reconnects, and the load balancer sends it to B.
    (third,) = ws_turns(b.ws, ALICE, [("And after a reconnect?", second["response"]["id"])])
    assert third["type"] == "response.completed", third
    turn_done(b, "And after a reconnect?", third["response"])

    # 3. Over HTTP, on either process.
    previous = third["response"]["id"]
    for process, text in ((a, "Over HTTP on A."), (b, "Over HTTP on B."), (b, "Again on B."), (a, "Back on A.")):
        reply = http_turn(process.http, ALICE, text, previous)
        assert reply.status_code == 200, reply.text
        turn_done(process, text, reply.json())
        previous = reply.json()["id"]

    # Which tier each continuation came from: A and B each rebuilt the other's latest response
    # from the store's snapshot (no full render); B's second HTTP turn found its own state hot.
    assert _resolved(a) == {("snapshot", "http"): 2}
    assert _resolved(b) == {("snapshot", "websocket"): 1, ("snapshot", "http"): 1, ("hot", "http"): 1}

    # 4. Tenants are isolated: Bob cannot continue Alice's conversation, on either process.
    for process in (a, b):
        denied = http_turn(process.http, BOB, "Let me in.", previous)
        assert denied.status_code == 400
        assert denied.json()["error"]["code"] == "previous_response_not_found"
        (event,) = ws_turns(process.ws, BOB, [("Let me in.", previous)])
        assert event["type"] == "error" and event["error"]["code"] == "previous_response_not_found"

    # 5. An expired entry is not found, on the process that still holds it hot and on the other.
    client = redis_admin
    keys = [k for k in client.scan_iter(match=f"*:{previous}")]
    assert len(keys) == 1
    client.pexpire(keys[0], 1)
    deadline = time.monotonic() + 10
    while client.exists(keys[0]) and time.monotonic() < deadline:
        time.sleep(0.01)
    for process in (a, b):
        gone = http_turn(process.http, ALICE, "Still there?", previous)
        assert gone.status_code == 400
        assert gone.json()["error"]["code"] == "previous_response_not_found"
        (event,) = ws_turns(process.ws, ALICE, [("Still there?", previous)])
        assert event["type"] == "error" and event["error"]["code"] == "previous_response_not_found"
