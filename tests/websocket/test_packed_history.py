"""The connection cache packs each conversation's history behind its newest node: counted, not timed.

A turn packs the nodes the lane's previous response left behind (its own input, the previous
turn's output), never the history again, and an ordinary continuation unpacks nothing (nor does
the simulated engine's scripted tool loop, which the benchmarks time in the server). A cached
conversation then costs at most 6 bytes a cached token, walked object by object in the server
(``benchmarks.suite.footprint``, the scale benchmark's measure). With the default in-process
store, a ``store: true`` conversation is left unpacked: the store holds the very same items.
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect
from wsclient import RENDERER

from benchmarks.suite.footprint import cache_footprint
from responses_cache import Scenario, SimulatedConfig, SimulatedEngine
from responses_cache.conversation import Conversation, packing
from responses_cache.session.session import Session
from tests.websocket.wsclient import completed_turn

pytestmark = pytest.mark.skipif(RENDERER is None, reason="needs the bundled harmony vocabulary")

TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
#: Real text, frozen: 72 kB of this project's docs (prose, tables, code; some non-ASCII). It
#: compresses worse than the scale benchmark's generated code (0.43 against 0.30 at zlib level 1).
CORPUS = (Path(__file__).parents[1] / "tokens" / "hf_corpus.txt").read_text()
#: Tool outputs as an agent reads them: ~1.5k tokens each.
SOURCES = [CORPUS[i : i + 6000] for i in range(0, len(CORPUS) - 6000, 6000)]


def _next_input(response: dict[str, Any], k: int) -> list[dict[str, Any]]:
    """The agent's next input: the output of the command the model called, else a new request."""
    call = next((o for o in response["output"] if o["type"] == "function_call"), None)
    if call is not None:
        return [{"type": "function_call_output", "call_id": call["call_id"], "output": SOURCES[k % len(SOURCES)]}]
    return [{"role": "user", "content": f"Read the next file: `cat file_{k}.py`"}]


def _agent(server: Any, turns: int, *, store: bool) -> tuple[list[dict[str, int]], dict[str, float]]:
    """An agent loop over one connection; per turn, what packing did during it (``packing.stats``),
    and at the end the connection cache's footprint and its nodes."""
    counted: list[dict[str, int]] = []
    with connect(server.ws_url, max_size=None, compression=None) as ws:
        body = {"model": "sim-1", "tools": TOOLS, "store": store}
        response = completed_turn(ws, {**body, "input": "Read `cat README.md` and the sources, then summarize them."})
        session = _session(response["id"])
        _settled(server, session, response["id"])
        for k in range(turns):
            before = _stats()
            response = completed_turn(ws, {**body, "previous_response_id": response["id"], "input": _next_input(response, k)})
            _settled(server, session, response["id"])
            after = _stats()
            counted.append({name: after[name] - before[name] for name in after})
        footprint = cache_footprint([session])
        nodes = _nodes(session)
    summary = {
        "bytes_per_token": footprint["total_bytes"] / footprint["cached_tokens"],
        "nodes": len(nodes),
        "packed_nodes": sum(n.packed for n in nodes),
    }
    return counted, summary


def _settled(server: Any, session: Session, response_id: str) -> None:
    """Wait until the server has put the response in the connection cache (which packs behind
    it, in the same call on the server's event loop): the response is the lane's latest, and a
    request the same loop answers after that has come back."""
    deadline = time.monotonic() + 10
    while (latest := session.cache.latest_on(None)) is None or latest.id != response_id:
        assert time.monotonic() < deadline, "the server did not cache the response"
        time.sleep(0.002)
    assert httpx.get(f"http://{server.host}:{server.port}/healthz").status_code == 200


def _stats() -> dict[str, int]:
    s = packing.stats
    return {"packed": s.packed, "items": s.items, "encoded_bytes": s.encoded_bytes, "unpacked": s.unpacked, "refused": s.refused}


def _session(response_id: str) -> Session:
    """The server's session of the connection that made ``response_id`` (the server runs in a
    thread of this process)."""
    deadline = time.monotonic() + 10
    while True:
        gc.collect()
        found = [o for o in gc.get_objects() if isinstance(o, Session) and any(s.id == response_id for s in o.cache.latest.values())]
        if found:
            assert len(found) == 1
            return found[0]
        assert time.monotonic() < deadline, "no session holds the response"
        time.sleep(0.002)


def _nodes(session: Session) -> list[Conversation]:
    state = next(iter(session.cache.latest.values()))
    out: list[Conversation] = []
    node: Conversation | None = state.conversation
    while node is not None and node.count:
        out.append(node)
        node = node.parent
    return out


@pytest.fixture
def server(responses_cache_server_factory: Any) -> Any:
    return responses_cache_server_factory(backend=SimulatedEngine(SimulatedConfig(instant=True)), renderer=RENDERER)


def test_a_turn_packs_what_the_previous_one_left_and_unpacks_nothing(server: Any) -> None:
    turns, summary = _agent(server, 24, store=False)
    # Each turn packs two nodes: its own input and the previous turn's output (the lane's newest
    # node until this turn), one item each here; the history before them is never packed again.
    assert [t["packed"] for t in turns] == [2] * 24
    assert [t["items"] for t in turns] == [2] * 24
    # Bytes packed per turn: this turn's input and the previous output only (a ~6 kB tool
    # output, or a one-line request), however long the history has grown.
    assert max(t["encoded_bytes"] for t in turns) < 2 * max(len(s) for s in SOURCES)
    # An ordinary continuation reads no packed node (the token log carries the history).
    assert [t["unpacked"] for t in turns] == [0] * 24
    assert [t["refused"] for t in turns] == [0] * 24
    assert summary["packed_nodes"] == summary["nodes"] - 1  # all but the newest


def test_a_cached_conversation_costs_at_most_6_bytes_a_token(server: Any) -> None:
    """The scale benchmark's measure (``benchmarks/suite/scale.py``): a context of ~19k tokens
    sent as one message, ``store: false``, its cache walked once the response is cached; here
    of real text. (Unpacked: 15.5 B/token, 11.3 of them the items: a string with a character
    past ASCII takes two bytes or more a character, plus the UTF-8 copy tokenizing attaches.)"""
    with connect(server.ws_url, max_size=None, compression=None) as ws:
        response = completed_turn(ws, {"model": "sim-1", "tools": TOOLS, "store": False, "input": "Context:\n" + CORPUS})
        session = _session(response["id"])
        _settled(server, session, response["id"])
        footprint = cache_footprint([session])
    assert footprint["cached_tokens"] > 15_000
    bytes_per_token = footprint["total_bytes"] / footprint["cached_tokens"]
    assert bytes_per_token <= 6.0, (bytes_per_token, footprint["bytes"])


def test_with_the_in_process_store_a_stored_conversation_stays_unpacked(server: Any) -> None:
    """The memory store keeps the same item objects: packing them would only add the packed copy."""
    turns, summary = _agent(server, 6, store=True)
    assert [t["packed"] for t in turns] == [0] * 6
    assert summary["packed_nodes"] == 0 and summary["nodes"] > 6


def test_a_lane_whose_client_resends_its_input_is_unpacked_once_and_kept_so(server: Any) -> None:
    """A client without ``previous_response_id`` has its whole input matched against the cached
    conversation, item by item, every turn: its lane is unpacked once and no longer packed."""
    body = {"model": "sim-1", "tools": TOOLS, "store": False}
    conversation: list[dict[str, Any]] = [{"role": "user", "content": SOURCES[0]}]
    with connect(server.ws_url, max_size=None, compression=None) as ws:
        response = completed_turn(ws, {**body, "input": conversation})
        session = _session(response["id"])
        _settled(server, session, response["id"])
        assert [n.packed for n in _nodes(session)] == [False, True]  # the first turn's input, behind its output
        counted: list[dict[str, int]] = []
        for k in range(1, 7):
            conversation += [*response["output"], {"role": "user", "content": SOURCES[k]}]
            before = _stats()
            response = completed_turn(ws, {**body, "input": conversation})
            _settled(server, session, response["id"])
            after = _stats()
            counted.append({name: after[name] - before[name] for name in after})
            assert response["usage"]["input_tokens_details"]["cached_tokens"] > 0  # matched, not rendered afresh
        assert not any(n.packed for n in _nodes(session))
    assert [c["unpacked"] for c in counted] == [1, 0, 0, 0, 0, 0]
    assert [c["packed"] for c in counted] == [0] * 6


def test_the_scenario_engine_plans_from_the_new_items_only(responses_cache_server_factory: Any) -> None:
    """The simulated engine's scripted tool loop counts the tool outputs since the user's request:
    from its previous count, so it reads no packed history (the benchmarks' server-side time stays
    the server's), and the steps it numbers are those of a count over the whole history."""
    engine = SimulatedEngine(SimulatedConfig(instant=True, scenario=Scenario(tool_calls=1_000, argument_tokens=20)))
    server = responses_cache_server_factory(backend=engine, renderer=RENDERER)
    body = {"model": "sim-1", "tools": TOOLS, "store": False}
    steps: list[int] = []
    unpacked: list[int] = []
    with connect(server.ws_url, max_size=None, compression=None) as ws:
        response = completed_turn(ws, {**body, "input": "Fix the parser."})
        session = _session(response["id"])
        for k in range(16):
            call = next(o for o in response["output"] if o["type"] == "function_call")
            steps.append(json.loads(call["arguments"])["step"])
            _settled(server, session, response["id"])
            before = packing.stats.unpacked
            output = [{"type": "function_call_output", "call_id": call["call_id"], "output": SOURCES[k % len(SOURCES)]}]
            response = completed_turn(ws, {**body, "previous_response_id": response["id"], "input": output})
            unpacked.append(packing.stats.unpacked - before)
    assert steps == list(range(1, 17))
    assert unpacked == [0] * 16
