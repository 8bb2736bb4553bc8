"""A ``responses-cache serve`` process SIGKILLed while a background response runs: restarted on
the same billing journal and Redis store, it marks that response ``failed`` (and bills it from
the journal)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from openai import OpenAI

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

#: An answer that takes minutes: the response is surely running when the kill lands.
ENGINE = json.dumps({"answer_tokens": 100_000, "output_tokens_per_s": 50})
DEADLINE_S = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, *args: str) -> None:
        self.port = _free_port()
        env = {**os.environ, "RESPONSES_CACHE_BACKEND_OPTIONS": ENGINE}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "responses_cache.cli", "serve", "--port", str(self.port), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    out = self.proc.stdout.read() if self.proc.stdout else ""
                    self.proc.kill()
                    raise AssertionError(f"server did not start: {out}") from None
                time.sleep(0.05)

    @property
    def client(self) -> OpenAI:
        return OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0, _strict_response_validation=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def test_a_killed_process_marks_its_background_responses_failed_on_restart(single_redis_url: str, tmp_path: Path) -> None:
    journal, sink = tmp_path / "usage.journal", tmp_path / "usage.jsonl"
    args = ("--store", single_redis_url, "--billing-journal", str(journal), "--billing-jsonl", str(sink))
    first = Server(*args)
    try:
        queued = first.client.responses.create(model="sim-1", input="A long job.", background=True)
        deadline = time.monotonic() + DEADLINE_S
        while first.client.responses.retrieve(queued.id).status != "in_progress":  # journaled by then
            assert time.monotonic() < deadline, "the response never started"
            time.sleep(0.02)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(DEADLINE_S)
    finally:
        first.stop()
    second = Server(*args)
    try:
        after = second.client.responses.retrieve(queued.id)
        assert after.status == "failed" and after.error is not None and after.error.code == "server_error"
    finally:
        second.stop()
    records = [json.loads(line) for line in sink.read_text().splitlines()]
    assert [(r["response_id"], r["status"], r["recovered"]) for r in records] == [(queued.id, "cancelled", True)]
