"""A ``responses-cache serve`` process SIGKILLed while a background response runs: restarted on
the same billing journal and Redis store, it marks that response ``failed`` (and bills it from
the journal)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from openai import OpenAI

from responses_cache.testing import ServeProcess, serve_in_process

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

#: An answer that takes minutes: the response is surely running when the kill lands.
ENGINE = json.dumps({"answer_tokens": 100_000, "output_tokens_per_s": 50})
DEADLINE_S = 20


def _serve(*args: str) -> ServeProcess:
    return serve_in_process(*args, env={**os.environ, "RESPONSES_CACHE_BACKEND_OPTIONS": ENGINE, "RESPONSES_CACHE_SEALING_KEY": "A" * 43 + "="}, timeout=DEADLINE_S)


def _client(server: ServeProcess) -> OpenAI:
    return OpenAI(base_url=server.http_url, api_key="unused", max_retries=0, _strict_response_validation=True)


def test_a_killed_process_marks_its_background_responses_failed_on_restart(single_redis_url: str, tmp_path: Path) -> None:
    journal, sink = tmp_path / "usage.journal", tmp_path / "usage.jsonl"
    args = ("--store", single_redis_url, "--billing-journal", str(journal), "--billing-jsonl", str(sink))
    with _serve(*args) as first:
        queued = _client(first).responses.create(model="sim-1", input="A long job.", background=True)
        deadline = time.monotonic() + DEADLINE_S
        while _client(first).responses.retrieve(queued.id).status != "in_progress":  # journaled by then
            assert time.monotonic() < deadline, "the response never started"
            time.sleep(0.02)
        first.kill()
    with _serve(*args) as second:
        after = _client(second).responses.retrieve(queued.id)
        assert after.status == "failed" and after.error is not None and after.error.code == "server_error"
    records = [json.loads(line) for line in sink.read_text().splitlines()]
    assert [(r["response_id"], r["status"], r["recovered"]) for r in records] == [(queued.id, "cancelled", True)]
