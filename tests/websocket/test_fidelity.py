"""Context fidelity (design invariant 1): whatever path a turn takes through the connection cache —
warm-up, continuation, fork, eviction, full-input reuse, reconnect and hydration — the backend
receives exactly the conversation that one request carrying the whole conversation as ``input``
would give it. Compared item by item on what the model sees (``backends.identity``, the package's
``render_key``: everything a renderer reads), ignoring ids and statuses. Resends that vary what
the renderer sees are in test_resend_fidelity.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from backends import RecordingBackend, call_key, identity, output_key, user_key
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wsclient import RENDERER, WS, check_stream, function_tool, ws_connect

from responses_cache.protocol.request import decode_input
from responses_cache.session.session import SessionConfig

TOOLS = [function_tool()]
INSTRUCTIONS = "You are a careful coding agent."
_tags = itertools.count()


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def output_of(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


class Agent:
    """A client that knows its conversations: ``history[response id]`` is everything up to and
    including that response's output, as input items the client could resend."""

    def __init__(self, ws: WS, backend: RecordingBackend) -> None:
        self.ws = ws
        self.backend = backend
        self.history: dict[str, list[dict[str, Any]]] = {}

    async def turn(
        self, new: list[dict[str, Any]], previous: str | None = None, *, full: list[dict[str, Any]] | None = None,
        call: str | None = None, **body: Any,
    ) -> tuple[dict[str, Any], str]:
        """One completed turn; returns (response, tag of its backend call)."""
        tag = f"t{next(_tags)}"
        metadata = {"tag": tag}
        if call is not None:
            metadata.update(call="run", args=json.dumps({"step": 1}), call_id=call)
        body.setdefault("instructions", INSTRUCTIONS)
        body.setdefault("tools", TOOLS)
        sent = new if full is None else full
        response = await self.ws.ok(input=sent, previous_response_id=previous, metadata=metadata, **body)
        before = self.history[previous] if previous is not None else []
        self.history[response["id"]] = [*before, *sent, *response["output"]]
        return response, tag

    def seen(self, tag: str) -> list[tuple[Any, ...]]:
        return self.backend.by_tag(tag).identities()


async def reference(url: str, backend: RecordingBackend, items: list[dict[str, Any]], **body: Any) -> list[tuple[Any, ...]]:
    """What the backend receives for one request carrying ``items`` whole, on a fresh connection."""
    tag = f"ref{next(_tags)}"
    body.setdefault("instructions", INSTRUCTIONS)
    body.setdefault("tools", TOOLS)
    async with ws_connect(url) as ws:
        await ws.ok(input=items, store=False, metadata={"tag": tag}, **body)
    seen = backend.by_tag(tag).identities()
    assert seen == [identity(i) for i in decode_input(json.dumps(items).encode())]
    return seen


async def test_warm_up_then_continuations(serve: Any, backend: RecordingBackend) -> None:
    """generate:false with the whole prompt, then an empty continuation and a tool loop."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        agent = Agent(ws, backend)
        warm, _ = await agent.turn([user("Fix the bug in parser.py")], store=False, generate=False)
        assert warm["output"] == []
        first, t1 = await agent.turn([], warm["id"], store=False, call="call_1")
        second, t2 = await agent.turn([output_of("call_1", "line 3: IndexError")], first["id"], store=False)
        assert agent.seen(t1) == await reference(server.ws_url, backend, agent.history[warm["id"]])
        assert agent.seen(t2) == await reference(
            server.ws_url, backend, [*agent.history[first["id"]], output_of("call_1", "line 3: IndexError")]
        )
        assert agent.seen(t2) == [
            user_key("Fix the bug in parser.py"),
            call_key("call_1", "run", '{"step": 1}'),
            output_key("call_1", "line 3: IndexError"),
        ]
        assert second["status"] == "completed"


async def test_forks_see_the_shared_prefix_plus_their_own_turns(serve: Any, backend: RecordingBackend) -> None:
    """Lane B forks from lane A's latest; both continue; each sees only its own branch."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        agent = Agent(ws, backend)
        a1, _ = await agent.turn([user("plan the work")], stream_id="A", store=False, call="call_a")
        a2, _ = await agent.turn([output_of("call_a", "3 files")], a1["id"], stream_id="A", store=False)
        b1, tb1 = await agent.turn([user("try approach B")], a2["id"], stream_id="B", store=False)
        a3, ta3 = await agent.turn([user("try approach A")], a2["id"], stream_id="A", store=False)
        b2, tb2 = await agent.turn([user("more B")], b1["id"], stream_id="B", store=False)
        a4, ta4 = await agent.turn([user("more A")], a3["id"], stream_id="A", store=False)
        for tag, parent, new in ((tb1, a2, "try approach B"), (ta3, a2, "try approach A"), (tb2, b1, "more B"), (ta4, a3, "more A")):
            assert agent.seen(tag) == await reference(server.ws_url, backend, [*agent.history[parent["id"]], user(new)])
        shared = len(agent.history[a2["id"]])
        assert agent.seen(tb2)[:shared] == agent.seen(ta4)[:shared]
        assert user_key("try approach A") not in agent.seen(tb2)
        assert user_key("try approach B") not in agent.seen(ta4)
        assert b2["status"] == a4["status"] == "completed"


async def test_after_eviction_hydration_and_full_resend_are_faithful(serve: Any, backend: RecordingBackend) -> None:
    """A tiny cache budget evicts lanes: a ``store: true`` continuation hydrates and a ``store:
    false`` client resends everything; both give the backend the same conversation."""
    server = serve(session=SessionConfig(max_cached_items=6), hot_cache_bytes=0)
    async with ws_connect(server.ws_url) as ws:
        agent = Agent(ws, backend)
        kept, _ = await agent.turn([user("stored lane")], stream_id="s", call="call_s")
        lost, _ = await agent.turn([user("volatile lane")], stream_id="v", store=False)
        for i in range(3):  # push both out of the 6-item budget
            await agent.turn([user(f"filler {i} " * 3), user("x"), user("y")], stream_id=f"f{i}", store=False)
        assert server.app.state.service.core.hydrations == 0
        hydrated, th = await agent.turn([output_of("call_s", "done")], kept["id"], stream_id="s")
        assert server.app.state.service.core.hydrations == 1
        assert agent.seen(th) == await reference(server.ws_url, backend, [*agent.history[kept["id"]], output_of("call_s", "done")])
        err = await ws.error(input=[user("again")], previous_response_id=lost["id"], stream_id="v", store=False)
        assert err["error"]["code"] == "previous_response_not_found"
        resend = [*agent.history[lost["id"]], user("again")]
        _, tr = await agent.turn([], None, full=resend, stream_id="v", store=False)
        assert agent.seen(tr) == await reference(server.ws_url, backend, resend)
        assert hydrated["status"] == "completed"


async def test_after_a_failure_evicts_the_lane_a_full_resend_is_faithful(serve: Any, backend: RecordingBackend) -> None:
    """A failed continuation evicts its parent; the client's full resend (no
    previous_response_id) gives the backend the same conversation as before the failure."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        agent = Agent(ws, backend)
        first, _ = await agent.turn([user("build it")], stream_id="w", store=False, call="call_b")
        new = [output_of("call_b", "build failed")]
        events = await ws.turn(
            input=new, previous_response_id=first["id"], stream_id="w", store=False, instructions=INSTRUCTIONS,
            tools=TOOLS, metadata={"fail_after": "0"},
        )
        assert check_stream(events)["status"] == "failed"
        err = await ws.error(input=new, previous_response_id=first["id"], stream_id="w", store=False)
        assert err["error"]["code"] == "previous_response_not_found"
        resend = [*agent.history[first["id"]], *new]
        _, tag = await agent.turn([], full=resend, stream_id="w", store=False)
        assert agent.seen(tag) == await reference(server.ws_url, backend, resend)
        assert server.app.state.metrics.total("full_input_reuse_total") == 0  # nothing cached to reuse


async def test_full_input_clients_reuse_the_cache(serve: Any, backend: RecordingBackend) -> None:
    """A client that always resends the whole conversation (no previous_response_id) reuses the
    lane's cached state: same backend input, and ``cached_tokens`` > 0 with a renderer."""
    server = serve()
    metrics = server.app.state.metrics
    async with ws_connect(server.ws_url) as ws:
        agent = Agent(ws, backend)
        conversation = [user("run the tests")]
        last, _ = await agent.turn([], full=conversation, store=False, call="call_t")
        usages = []
        for new in ([output_of("call_t", "2 failed")], [user("fix them")], [user("thanks")]):
            conversation = [*agent.history[last["id"]], *new]
            last, tag = await agent.turn([], full=conversation, store=False)
            usages.append(last["usage"])
            assert agent.seen(tag) == await reference(server.ws_url, backend, conversation)
        assert metrics.total("full_input_reuse_total") == 3
        # a resend that does not extend the cached conversation is a fresh render, still faithful
        changed = [user("something else entirely"), *conversation[1:]]
        _, tag = await agent.turn([], full=changed, store=False)
        assert agent.seen(tag) == await reference(server.ws_url, backend, changed)
        assert metrics.total("full_input_reuse_total") == 3
    if RENDERER is not None:
        assert all(u["input_tokens_details"]["cached_tokens"] > 0 for u in usages)


async def test_full_input_reuse_is_stored_whole(serve: Any, backend: RecordingBackend) -> None:
    """A ``store: true`` response that reused the cache for a full-input request is persisted with
    its whole input, so continuing it after a reconnect (hydration) sees the whole conversation."""
    server = serve(hot_cache_bytes=0)  # the store tier: no process-wide hot cache
    async with ws_connect(server.ws_url) as ws:
        agent = Agent(ws, backend)
        first, _ = await agent.turn([user("step one")])
        full = [*agent.history[first["id"]], user("step two")]
        second, _ = await agent.turn([], full=full)
        assert server.app.state.metrics.total("full_input_reuse_total") == 1
    async with ws_connect(server.ws_url) as ws:
        agent.ws = ws
        _, tag = await agent.turn([user("step three")], second["id"])
    assert server.app.state.service.core.hydrations == 1
    assert agent.seen(tag) == await reference(server.ws_url, backend, [*agent.history[second["id"]], user("step three")])


async def test_reconnect_with_store_true_hydrates_faithfully(serve: Any, backend: RecordingBackend) -> None:
    """A store:true tool loop, interrupted by a reconnect, continues with exactly the same context."""
    server = serve(hot_cache_bytes=0)  # the store tier: no process-wide hot cache
    async with ws_connect(server.ws_url) as ws:
        agent = Agent(ws, backend)
        response, _ = await agent.turn([user("start")], call="call_0")
        for i in range(1, 4):
            response, _ = await agent.turn([output_of(f"call_{i - 1}", f"out {i}")], response["id"], call=f"call_{i}")
    async with ws_connect(server.ws_url) as ws:
        agent.ws = ws
        new = [output_of("call_3", "out 4")]
        final, tag = await agent.turn(new, response["id"])
        again, tag2 = await agent.turn([user("bye")], final["id"], store=False)  # then from the cache
    assert server.app.state.service.core.hydrations == 1
    assert agent.seen(tag) == await reference(server.ws_url, backend, [*agent.history[response["id"]], *new])
    assert agent.seen(tag2) == await reference(server.ws_url, backend, [*agent.history[final["id"]], user("bye")])
    assert again["status"] == "completed"


# -- property: any mix of paths is faithful ------------------------------------------------------------

LANES = (None, "a", "b")
op = st.one_of(
    st.tuples(st.just("new"), st.sampled_from(LANES), st.booleans()),
    st.tuples(st.just("continue"), st.sampled_from(LANES), st.booleans()),
    st.tuples(st.just("fork"), st.sampled_from(LANES), st.sampled_from(LANES)),
    st.tuples(st.just("warm"), st.sampled_from(LANES), st.booleans()),
    st.tuples(st.just("call"), st.sampled_from(LANES), st.booleans()),
    st.tuples(st.just("full"), st.sampled_from(LANES), st.booleans()),
    st.tuples(st.just("reconnect"), st.none(), st.none()),
)


@pytest.fixture
def shared_server(serve: Any) -> Any:
    """One server for all of a property test's examples (fixtures are not reset between them).
    Without the superseded responses' grace period, so the script's model of the cache is the
    spec's (each lane keeps its latest response)."""
    return serve(session=SessionConfig(superseded_keep=0))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=st.lists(op, min_size=1, max_size=8))
def test_any_mix_of_paths_is_faithful(shared_server: Any, backend: RecordingBackend, script: list[tuple[Any, ...]]) -> None:
    """Random scripts of fresh chains, continuations, forks, warm-ups, tool calls, full-input resends
    and reconnects: every turn's backend input equals the client's whole-conversation model, and
    ``previous_response_not_found`` comes exactly when the parent is neither cached on this
    connection nor (for a ``store: true`` request) stored."""
    asyncio.run(_run_script(shared_server.ws_url, backend, script))


async def _run_script(url: str, backend: RecordingBackend, script: list[tuple[Any, ...]]) -> None:
    latest: dict[str | None, str] = {}  # lane → its latest response id on this connection
    stored: set[str] = set()
    open_call: dict[str, str] = {}  # response id → the call it left open
    ws_cm = ws_connect(url)
    ws = await ws_cm.__aenter__()
    agent = Agent(ws, backend)
    try:
        for step, (kind, x, y) in enumerate(script):
            if kind == "reconnect":
                await ws_cm.__aexit__(None, None, None)
                ws_cm = ws_connect(url)
                agent.ws = ws = await ws_cm.__aenter__()
                latest.clear()
                continue
            lane = x
            text = f"step {step}"
            parent: str | None = None
            store = True
            if kind in ("continue", "fork"):
                source = lane if kind == "continue" else y
                parent = latest.get(source)
                if parent is None:
                    parent = next(iter(agent.history), None)  # an older, probably uncached one
                if parent is None:
                    continue
                store = bool(y) if kind == "continue" else False
            elif kind in ("new", "warm", "call", "full"):
                store = bool(y)
            new = [output_of(open_call[parent], "result")] if parent in open_call else []
            new.append(user(text))
            cached = parent is not None and parent in latest.values()
            if parent is not None and not cached and not (store and parent in stored):
                err = await ws.error(input=new, previous_response_id=parent, stream_id=lane, store=store,
                                     instructions=INSTRUCTIONS, tools=TOOLS)
                assert err["error"]["code"] == "previous_response_not_found"
                continue
            full = None
            if kind == "full" and latest.get(lane) is not None:
                base = latest[lane]
                resend = [output_of(open_call[base], "result")] if base in open_call else []
                full = [*agent.history[base], *resend, user(text)]
            response, tag = await agent.turn(
                new, parent, full=full, stream_id=lane, store=store, generate=kind != "warm",
                call=f"call_{step}" if kind == "call" else None,
            )
            expected_items = [*agent.history[parent], *new] if parent is not None else (full or new)
            if kind != "warm":
                assert agent.seen(tag) == [identity(i) for i in decode_input(json.dumps(expected_items).encode())]
            latest[lane] = response["id"]
            if store:
                stored.add(response["id"])
            if kind == "call":
                open_call[response["id"]] = f"call_{step}"
    finally:
        await ws_cm.__aexit__(None, None, None)


def test_check_stream_rejects_bad_numbering() -> None:
    """The helper the suite relies on fails on a gap in ``sequence_number``."""
    created = {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_1"}}
    done = {"type": "response.completed", "sequence_number": 2, "response": {"id": "resp_1"}}
    with pytest.raises(AssertionError):
        check_stream([created, done])
