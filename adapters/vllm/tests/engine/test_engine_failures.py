"""A real vLLM killed mid-stream, a conversation failing over to a second replica, and the killed
engine coming back (network mode: in-process, the middleware dies with its engine)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_suite import ENDLESS, KEY, MODEL, NICE, Prelaunch, group, network_backend, sdk, turn

from benchmarks.suite.vllmproc import VllmProcess, tiny_model
from responses_cache import create_app
from tests.websocket.wsclient import check_event

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]  # the first one installs vLLM


@group("spare")
def _spare(python: Path) -> dict[str, VllmProcess]:
    # Network mode only (no middleware inside), started twice: the fast start (eager, one process).
    return {"spare": VllmProcess(python, tiny_model(python, MODEL), api_key=KEY, fast_start=True, nice=NICE)}


@pytest.fixture(scope="module")
def spare(prelaunch: Prelaunch) -> Iterator[VllmProcess]:
    with prelaunch.take("spare") as started:
        yield started["spare"]


def test_a_killed_engine_fails_the_response_and_its_conversation_goes_on_elsewhere_and_after_restart(
    spare: VllmProcess, engines: dict[str, VllmProcess], responses_cache_server_factory: Callable[..., Any]
) -> None:
    other = engines["scale_out"]

    def server(*replicas: VllmProcess) -> Any:
        backend = network_backend(*replicas, cooldown=0.0)
        return responses_cache_server_factory(create_app(backend=backend, renderer="harmony", api_keys=[KEY]))

    both, alone = server(spare, other), server(spare)
    with sdk(both.http_url) as client, client.responses.connect() as conn:
        # Find a conversation pinned to the spare engine (rendezvous placement over the two). A
        # new input each time: a resent one would continue the earlier conversation (full-input match).
        for n in range(20):
            before = spare.counters().finished
            first = turn(conn, input=f"Hello there, number {n}.", store=True)  # continued after a failure
            if spare.counters().finished > before:
                break
        else:
            pytest.fail("no conversation was placed on the spare engine in 20 tries")
        # Killed mid-stream: the response fails with the engine error, the socket stays open.
        conn.response.create(model=MODEL, store=True, input="Go on forever.", previous_response_id=first["id"],
                             **ENDLESS)
        while (event := json.loads(conn.recv_bytes()))["type"] != "response.output_text.delta":
            check_event(event)
        spare.kill()
        while (event := json.loads(conn.recv_bytes()))["type"] not in ("response.failed", "response.completed"):
            check_event(event)
        check_event(event)
        assert event["type"] == "response.failed", event
        assert event["response"]["error"]["code"] == "server_error"
        # The conversation goes on on the other replica, with its whole context (no cache there).
        served = other.counters().finished
        again = turn(conn, input="Are you still there?", previous_response_id=first["id"], store=True)
        assert again["status"] == "completed" and other.counters().finished == served + 1
        assert again["usage"]["input_tokens"] > first["usage"]["input_tokens"] + first["usage"]["output_tokens"]

    with sdk(alone.http_url) as client, client.responses.connect() as conn:
        # With no replica left: a clear error, and the socket stays open.
        conn.response.create(model=MODEL, store=False, input="Anyone?")
        while (event := json.loads(conn.recv_bytes()))["type"] not in ("response.failed", "error"):
            check_event(event)
        check_event(event)
        failure = event["response"]["error"] if event["type"] == "response.failed" else event["error"]
        assert failure["code"] == "server_error" and "replica" in failure["message"], failure
        spare.start()  # the same port: back in service
        assert turn(conn, input="And now?")["status"] == "completed"
