"""``responses-cache serve`` processes sharing one store, as a deployment runs them: each on a
port of its own that stays its own across restarts (so a proxy's upstream finds the restarted
process), one API key, one sealing key, the simulated engine at a chosen decode rate, and a
JSONL usage ledger per start. The tests behind a proxy, the Sentinel failover run
(:mod:`.failover`) and the rolling-restart run (:mod:`.rolling_restart`) start theirs with it."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from responses_cache.core.auth import tenant_of_key
from responses_cache.testing import ServeProcess, free_port, serve_in_process

KEY = "sk-proxy"
MODEL = "sim-1"
#: The key every process seals with (processes sharing a store need one, the same).
SEALING_KEY = base64.b64encode(bytes(range(32))).decode()
#: The tool a coding agent offers (Codex's ``exec_command``): the simulated engine calls it for
#: a user turn that asks to run a command in backquotes.
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
    }
]


@dataclass
class Deployment:
    """``count`` ``serve`` processes on fixed ports sharing the store ``store``; :meth:`start`
    starts (or restarts) one, :meth:`records` reads every usage record written so far. They
    accept ``key`` and each of ``more_keys``, each key a tenant of its own (tests sharing one
    deployment each take one, and count their own tenant's records)."""

    tmp: Path
    store: str
    tokens_per_s: float
    count: int = 2
    key: str = KEY
    more_keys: tuple[str, ...] = ()
    answer_tokens: int = 24
    drain_timeout_s: float = 30.0
    #: ``serve``'s log level (``info``: uvicorn's shutdown steps are in the log too).
    log_level: str = "warning"
    ports: tuple[int, ...] = ()
    processes: list[ServeProcess] = field(default_factory=list)
    ledgers: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.ports:
            self.ports = tuple(free_port() for _ in range(self.count))

    def start(self, index: int, *, wait: bool = True) -> ServeProcess:
        """Start process ``index`` (again, after a stop), ready unless ``wait`` is false."""
        settings = self.tmp / "serve.toml"
        settings.write_text(
            f"[backend_options]\noutput_tokens_per_s = {self.tokens_per_s}\n"
            f"answer_tokens = {self.answer_tokens}\n"
        )
        ledger = self.tmp / f"usage-{index}-{len(self.ledgers)}.jsonl"
        self.ledgers.append(ledger)
        server = serve_in_process(
            "--port",
            str(self.ports[index]),  # the last --port wins: the upstream the proxy knows
            "--config",
            str(settings),
            *(arg for key in (self.key, *self.more_keys) for arg in ("--api-key", key)),
            "--store",
            self.store,
            "--billing-jsonl",
            str(ledger),
            "--drain-timeout-s",
            str(self.drain_timeout_s),
            "--log-level",
            self.log_level,
            env={**os.environ, "RESPONSES_CACHE_SEALING_KEY": SEALING_KEY},
            log=self.tmp / f"serve-{index}-{len(self.ledgers)}.log",
            wait=False,
        )
        server.port = self.ports[index]
        if wait:
            server.wait_ready()
        if index < len(self.processes):
            self.processes[index] = server
        else:
            self.processes.append(server)
        return server

    def start_all(self) -> None:
        """Start every process together, and return once all are ready."""
        for index in range(self.count):
            self.start(index, wait=False)
        for server in self.processes:
            server.wait_ready()

    def running(self) -> None:
        """Start whichever process is not running (never started, or stopped since), and return
        once all are ready."""
        for index in range(self.count):
            if index >= len(self.processes) or self.processes[index].proc.poll() is not None:
                self.start(index, wait=False)
        for server in self.processes:
            server.wait_ready()

    def records(self, key: str | None = None) -> list[dict[str, Any]]:
        """The usage records written so far by every process started (``key``: of its tenant only)."""
        records = [
            json.loads(line)
            for path in self.ledgers
            if path.exists()
            for line in path.read_text().splitlines()
        ]
        return records if key is None else [r for r in records if r["tenant"] == tenant_of_key(key)]

    def stop(self) -> None:
        for server in self.processes:
            server.kill()
