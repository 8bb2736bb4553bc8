"""Helpers of the real-engine suite (the fixtures are in ``conftest.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from openai import OpenAI
from responses_cache_vllm import EngineBackend

from benchmarks.suite import vllmproc
from tests.websocket.wsclient import TERMINAL, check_event, check_stream

MODEL = "tiny-oss"
KEY = "sk-engine"
#: Greedy decoding never samples the tiny model's stop token: a generation that runs until it is
#: stopped (or reaches max_output_tokens).
ENDLESS = {"temperature": 0, "max_output_tokens": 3000}


@dataclass
class Target:
    """Where a test's WebSocket connects, and the engine behind it."""

    mode: str  # "network" or "in-process"
    endpoint: str  # "generate" or "completions"
    engine: vllmproc.VllmProcess
    http_url: str  # base URL for the SDK (…/v1)
    ws_url: str


def network_backend(*engines: vllmproc.VllmProcess, **options: Any) -> EngineBackend:
    options.setdefault("template", "harmony")
    return EngineBackend([e.url for e in engines], model=MODEL, api_key=KEY, **options)


def sdk(http_url: str, key: str = KEY) -> OpenAI:
    return OpenAI(base_url=http_url, api_key=key, max_retries=0)


def turn(conn: Any, **body: Any) -> dict[str, Any]:
    """One response over an SDK connection: every frame validated strictly; its final response."""
    conn.response.create(**{"model": MODEL, "store": False, **body})
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(conn.recv_bytes())
        check_event(event)
        assert event["type"] != "error", event
        events.append(event)
        if event["type"] in TERMINAL:
            return check_stream(events)


def next_event(conn: Any, *kinds: str) -> dict[str, Any]:
    """Read (and validate) frames until one of ``kinds``."""
    while True:
        event = json.loads(conn.recv_bytes())
        check_event(event)
        if event["type"] in kinds:
            return dict(event)
