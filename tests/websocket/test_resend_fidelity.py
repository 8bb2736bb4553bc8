"""Resend fidelity: however a client resends its conversation, the engine gets a fresh full render.

Random client scripts over WebSocket and HTTP, ``store: true`` and ``false``: fresh chains,
continuations, forks across lanes, reconnects (hydration from the store) and, above all, full-input
resends that change the conversation the client holds in every way a renderer can see (an
assistant message's ``phase``, content-part boundaries, whitespace, call ids, argument bytes,
reasoning encodings) or cannot (ids, statuses, a string for one text part). After every turn the
prompt the recording backend received must equal a fresh full render of the client's conversation,
and the items it received must render like the client's (``render_key``).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from typing import Any

import httpx
import msgspec
import pytest
from backends import RecordingBackend, until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wsclient import MODEL, RENDERER, WS, function_tool, ws_connect

from responses_cache.protocol.request import decode_input
from responses_cache.session.session import SessionConfig
from responses_cache.tokens.key import render_key

pytestmark = pytest.mark.skipif(RENDERER is None, reason="needs the bundled harmony vocabulary")

TOOLS = [function_tool()]
INSTRUCTIONS = "Resend fidelity."
LANES = (None, "a", "b")
_tags = itertools.count()
Items = list[dict[str, Any]]


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


PRELUDE: Items = [  # a conversation carried over from elsewhere: reasoning and a commentary message
    user("earlier question"),
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think it over"}]},
    {"type": "message", "role": "assistant", "phase": "commentary", "content": [{"type": "output_text", "text": "Let me check."}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done: it works."}]},
]


def open_call(items: Items) -> str | None:
    """The call the conversation ends waiting on, if any."""
    answered = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    calls = [i["call_id"] for i in items if i.get("type") == "function_call" and i["call_id"] not in answered]
    return calls[-1] if calls else None


def new_items(base: Items, text: str) -> Items:
    call = open_call(base)
    answer = [{"type": "function_call_output", "call_id": call, "output": f"result of {call}"}] if call else []
    return [*answer, user(text)]


# -- variations of a conversation the client resends -----------------------------------------------

def _texts(item: dict[str, Any]) -> list[dict[str, Any]] | None:
    """An item's list of text parts (a string content becomes one part first)."""
    if item.get("type") != "message":
        return None
    if isinstance(item["content"], str):
        kind = "output_text" if item["role"] == "assistant" else "input_text"
        item["content"] = [{"type": kind, "text": item["content"]}]
    return item["content"]  # type: ignore[no-any-return]


_APPLIES = {
    "phase": lambda x: x.get("type") == "message" and x["role"] == "assistant",
    "split": lambda x: x.get("type") == "message",
    "join": lambda x: x.get("type") == "message" and isinstance(x["content"], list) and len(x["content"]) >= 2,
    "call_id": lambda x: x.get("type") == "function_call",
    "args": lambda x: x.get("type") == "function_call",
    "reasoning": lambda x: x.get("type") == "reasoning",
}


def vary(items: Items, data: st.DataObject) -> tuple[Items, bool]:
    """``items`` with random variations; True when one of them is visible to the renderer."""
    out = copy.deepcopy(items)
    visible = False
    for _ in range(data.draw(st.integers(0, 3), label="variations")):
        if not out:
            break
        what = data.draw(st.sampled_from(["ids", "string", "phase", "split", "join", "space", "call_id", "args", "reasoning"]), label="what")
        # an item the variation applies to, where there is one
        wanted = _APPLIES.get(what)
        candidates = [i for i, x in enumerate(out) if wanted is None or wanted(x)] or list(range(len(out)))
        item = out[data.draw(st.sampled_from(candidates), label="at")]
        kind = item.get("type")
        if what == "ids":  # invisible: ids and statuses (a client that rebuilds its items)
            for each in out:
                each.pop("id", None)
                each.pop("status", None)
        elif what == "string" and kind == "message" and len(item["content"]) == 1 and not isinstance(item["content"], str):
            item["content"] = item["content"][0]["text"]  # invisible: one text part as a string
        elif what == "phase" and kind == "message" and item["role"] == "assistant":
            if item.get("phase") == "commentary":
                item.pop("phase")
            else:
                item["phase"] = "commentary"
            visible = True
        elif what == "split" and (parts := _texts(item)) and len(parts[0]["text"]) >= 2:
            text = parts[0]["text"]
            cut = data.draw(st.integers(1, len(text) - 1), label="cut")
            parts[0:1] = [{**parts[0], "text": text[:cut]}, {**parts[0], "text": text[cut:]}]
            visible = True
        elif what == "join" and (parts := _texts(item)) and len(parts) >= 2:
            parts[0:2] = [{**parts[0], "text": parts[0]["text"] + parts[1]["text"]}]
            visible = True
        elif what == "space" and (parts := _texts(item)):
            parts[-1]["text"] += data.draw(st.sampled_from([" ", "\n", "\t", "  "]), label="space")
            visible = True
        elif what == "call_id" and kind == "function_call":
            old, new = item["call_id"], item["call_id"] + "x"
            for other in out:
                if other.get("call_id") == old:
                    other["call_id"] = new
            visible = True
        elif what == "args" and kind == "function_call":
            item["arguments"] = data.draw(st.sampled_from(['{"step":1}', '{ "step": 1 }', '{"step": 1}\n', '{"step": 2}']), label="args")
            visible = True
        elif what == "reasoning" and kind == "reasoning":
            encoding = data.draw(st.sampled_from(["summary", "encrypted", "more"]), label="encoding")
            text = "".join(p["text"] for p in item.get("content") or item["summary"])
            if encoding == "summary":
                item["summary"], item["content"] = [{"type": "summary_text", "text": text}], []
            elif encoding == "encrypted":
                item["encrypted_content"] = "gAAAA" + text.encode().hex()
            else:
                item["content"] = [{"type": "reasoning_text", "text": text}, {"type": "reasoning_text", "text": " again"}]
            visible = True
    return out, visible


# -- the script --------------------------------------------------------------------------------------

op = st.tuples(
    st.sampled_from(["new", "resend", "resend", "resend", "continue", "fork", "reconnect"]),
    st.sampled_from(["websocket", "websocket", "http"]),
    st.sampled_from(LANES),
    st.booleans(),  # store
    st.booleans(),  # the reply is a function call
)


@pytest.fixture
def shared_server(serve: Any) -> Any:
    """One server for all of a property test's examples (fixtures are not reset between them)."""
    return serve()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(script=st.lists(op, min_size=2, max_size=9), data=st.data())
def test_every_resend_reaches_the_engine_as_a_fresh_full_render(
    shared_server: Any, backend: RecordingBackend, script: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    asyncio.run(Script(shared_server, backend, data).run(script))


class Script:
    def __init__(self, server: Any, backend: RecordingBackend, data: st.DataObject) -> None:
        self.server = server
        self.backend = backend
        self.data = data
        #: response id → the conversation the client holds after it (what it sent + the output)
        self.history: dict[str, Items] = {}
        self.latest: dict[str | None, str] = {}  # lane → latest response on this connection
        self.stored: set[str] = set()  # responses whose whole chain is stored

    async def run(self, script: list[tuple[Any, ...]]) -> None:
        self.ws_cm = ws_connect(self.server.ws_url)
        self.ws: WS = await self.ws_cm.__aenter__()
        try:
            async with httpx.AsyncClient(timeout=15) as self.http:
                for step, (kind, transport, lane, store, call) in enumerate(script):
                    await self.step(step, kind, transport, lane, store, call)
        finally:
            await self.ws_cm.__aexit__(None, None, None)

    async def step(self, step: int, kind: str, transport: str, lane: str | None, store: bool, call: bool) -> None:
        if kind == "reconnect":
            await self.ws_cm.__aexit__(None, None, None)
            self.ws_cm = ws_connect(self.server.ws_url)
            self.ws = await self.ws_cm.__aenter__()
            self.latest.clear()
            return
        text = f"step {step}"
        previous: str | None = None
        cache_expected = False
        if kind == "new" or not self.history:
            prelude = PRELUDE if self.data.draw(st.booleans(), label="prelude") else []
            sent = [*prelude, user(text)]
            conversation = sent
        elif kind == "resend":
            base_id = self.latest.get(lane) if transport == "websocket" else None
            base = self.history[base_id or self.data.draw(st.sampled_from(list(self.history)), label="base")]
            varied, visible = vary(base, self.data)
            cache_expected = base_id is not None and not visible
            sent = conversation = [*varied, *new_items(varied, text)]
        else:  # continue / fork: from a parent this transport can reach
            # (in the order they were created: response ids are random, the script must not be)
            cached = set(self.latest.values())
            parents = [r for r in self.history if r in self.stored or (transport == "websocket" and r in cached)]
            if kind == "continue" and transport == "websocket" and lane in self.latest:
                parents = [self.latest[lane]]
            if not parents:
                return
            previous = self.data.draw(st.sampled_from(parents), label="parent")
            if previous not in self.latest.values():
                store = True  # only a stored response can be hydrated
            sent = new_items(self.history[previous], text)
            conversation = [*self.history[previous], *sent]
        tag = f"r{next(_tags)}"
        reuses = self.server.app.state.metrics.total("full_input_reuse_total")
        metadata = {"tag": tag}
        if call:
            metadata.update(call="run", args='{"step": 1}', call_id=f"call_{tag}")
        body: dict[str, Any] = {
            "model": MODEL, "input": sent, "previous_response_id": previous, "instructions": INSTRUCTIONS,
            "tools": TOOLS, "store": store, "metadata": metadata,
        }
        if transport == "websocket":
            response = await self.ws.ok(**body, stream_id=lane)
            self.latest[lane] = response["id"]
        else:
            reply = await self.http.post(self.server.http_url + "/responses", json=body)
            assert reply.status_code == 200, reply.text
            response = reply.json()
        self.history[response["id"]] = [*conversation, *response["output"]]
        if store and (previous is None or previous in self.stored):
            self.stored.add(response["id"])  # hydratable: its whole chain is stored
        self.check(tag, conversation, response)
        if store:  # what is stored (and hydrated later) is what the client sent, not the cache's shapes
            stored = await self.server.app.state.service.core.store.get("default", response["id"])
            assert msgspec.json.encode(list(stored.input_items)) == msgspec.json.encode(decode_input(json.dumps(sent).encode()))
        if cache_expected:  # nothing the renderer sees changed: the whole prefix came from the cache
            assert self.server.app.state.metrics.total("full_input_reuse_total") > reuses
            assert response["usage"]["input_tokens_details"]["cached_tokens"] > 0

    def check(self, tag: str, conversation: Items, response: dict[str, Any]) -> None:
        call = self.backend.by_tag(tag)
        items = decode_input(json.dumps(conversation).encode())
        prompt = call.request.prompt
        assert prompt is not None
        r = prompt.renderer
        expected = list(r.prompt(r.render_full(INSTRUCTIONS, call.request.tools, items)))
        got = list(prompt.tokens())
        if got != expected:
            at = next((i for i, (x, y) in enumerate(zip(got, expected, strict=False)) if x != y), min(len(got), len(expected)))
            raise AssertionError(
                f"prompt differs from a fresh full render at token {at}:\n"
                f"got      …{r.decode(got[max(0, at - 30) : at + 30])!r}\nexpected …{r.decode(expected[max(0, at - 30) : at + 30])!r}"
            )
        assert call.identities() == [render_key(i) for i in items]
        assert response["usage"]["input_tokens"] == len(expected)


# -- the three cases the property test was written for, spelled out -----------------------------------


async def _turn(ws: WS, backend: RecordingBackend, items: Items, **body: Any) -> tuple[dict[str, Any], list[int], list[int]]:
    """Send ``items`` whole; returns (response, prompt the engine got, a fresh full render of it)."""
    tag = f"e{next(_tags)}"
    response = await ws.ok(input=items, instructions=INSTRUCTIONS, tools=TOOLS, metadata={"tag": tag}, **body)
    prompt = backend.by_tag(tag).request.prompt
    assert prompt is not None
    r = prompt.renderer
    fresh = r.prompt(r.render_full(INSTRUCTIONS, backend.by_tag(tag).request.tools, decode_input(json.dumps(items).encode())))
    return response, list(prompt.tokens()), list(fresh)


async def test_a_phase_added_on_resend_is_rendered(serve: Any, backend: RecordingBackend) -> None:
    """Adding ``phase: "commentary"`` to an earlier assistant message changes its channel, and with
    no final message left the earlier analysis is shown again: the resend is re-rendered from there."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        first = [user("q"), PRELUDE[1], {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A."}]}]
        response, got, fresh = await _turn(ws, backend, [*first, user("next")])
        assert got == fresh
        history = [*first, user("next"), *response["output"]]
        history[2] = {**history[2], "phase": "commentary"}
        history[-1] = {**history[-1], "phase": "commentary"}
        _, got, fresh = await _turn(ws, backend, [*history, user("again")])
        assert got == fresh and "think it over" in backend.calls[-1].request.prompt.renderer.decode(got)  # type: ignore[union-attr]
    assert server.app.state.metrics.total("full_input_reuse_total") == 1  # the prefix before it was reused


async def test_content_part_boundaries_on_resend_are_rendered_and_stored(serve: Any, backend: RecordingBackend) -> None:
    """``["hello wor", "ld"]`` is not ``"hello world"`` (either way round), and a ``store: true``
    resend stores the client's items, so a later continuation (cached or hydrated) keeps them."""
    server = serve()
    store = server.app.state.service.core.store
    async with ws_connect(server.ws_url) as ws:
        response, got, fresh = await _turn(ws, backend, [user("start"), user("hello world")])
        assert got == fresh
        split = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello wor"}, {"type": "input_text", "text": "ld"}]}
        resent = [user("start"), split, *[{k: v for k, v in i.items() if k not in ("id", "status")} for i in response["output"]], user("more")]
        second, got, fresh = await _turn(ws, backend, resent)
        assert got == fresh
        stored = await store.get("default", second["id"])
        assert msgspec.json.encode(list(stored.input_items)) == msgspec.json.encode(decode_input(json.dumps(resent).encode()))
        # render-equal but not identical (no ids, a string for one text part): reused whole, and
        # still stored as sent
        plain = [*resent, *[{k: v for k, v in i.items() if k not in ("id", "status")} for i in second["output"]], user("go")]
        plain[0] = {"type": "message", "role": "user", "content": "start"}
        reuses = server.app.state.metrics.total("full_input_reuse_total")
        third, got, fresh = await _turn(ws, backend, plain)
        assert got == fresh and server.app.state.metrics.total("full_input_reuse_total") == reuses + 1
        assert third["usage"]["input_tokens_details"]["cached_tokens"] > 0
        stored = await store.get("default", third["id"])
        assert msgspec.json.encode(list(stored.input_items)) == msgspec.json.encode(decode_input(json.dumps(plain).encode()))
        joined = [*resent[:1], user("hello world"), *resent[2:]]
        _, got, fresh = await _turn(ws, backend, joined, store=False)
        assert got == fresh
    async with ws_connect(server.ws_url) as ws:  # hydration of the stored resend
        tag = f"e{next(_tags)}"
        await ws.ok(input=[user("after reconnect")], previous_response_id=second["id"], instructions=INSTRUCTIONS, tools=TOOLS, metadata={"tag": tag})
        prompt = backend.by_tag(tag).request.prompt
        assert prompt is not None
        r = prompt.renderer
        items = decode_input(json.dumps([*resent, *second["output"], user("after reconnect")]).encode())
        assert list(prompt.tokens()) == list(r.prompt(r.render_full(INSTRUCTIONS, backend.by_tag(tag).request.tools, items)))


async def test_a_fork_sent_with_a_continuation_finds_its_parent(serve: Any, backend: RecordingBackend) -> None:
    """Lane ``b`` is busy, so a fork from lane ``a``'s latest response starts only after ``a``'s
    continuation (sent at the same moment) has superseded it: the grace period keeps the parent."""
    for keep, found in ((8, True), (0, False)):
        server = serve(session=SessionConfig(superseded_keep=keep))
        async with ws_connect(server.ws_url) as ws:
            parent = await ws.ok(input="base", stream_id="a", store=False)
            await ws.create(input="busy", stream_id="b", store=False, metadata={"gate": f"g{keep}"})
            await until(lambda k=keep: backend.gates.waiting(f"g{k}"), "lane b to be busy")
            await ws.create(input="fork", stream_id="b", previous_response_id=parent["id"], store=False)
            await ws.create(input="next", stream_id="a", previous_response_id=parent["id"], store=False)
            await ws.finish("a")  # a's continuation completed: the parent is superseded on lane a
            backend.gates.release(f"g{keep}")
            await ws.finish("b")
            events = await ws.finish("b")
            assert (events[-1]["type"] == "response.completed") is found, events[-1]
            assert server.app.state.metrics.total("cache_grace_hits_total") == int(found)
            if not found:
                assert events[-1]["error"]["code"] == "previous_response_not_found"


async def test_errors_in_a_matched_resend_name_the_clients_index(serve: Any, backend: RecordingBackend) -> None:
    """A full-input request matched against the cache runs only its items after the reused ones;
    an error in them still names the item's place in the input the client sent."""
    server = serve()
    async with ws_connect(server.ws_url) as ws:
        first = await ws.ok(input=[user("one"), user("two")], instructions=INSTRUCTIONS, tools=TOOLS)
        resend = [user("one"), user("two"), *first["output"], user("three"), {"type": "function_call_output", "call_id": "nope", "output": "?"}]
        err = await ws.error(input=resend, instructions=INSTRUCTIONS, tools=TOOLS)
        assert err["error"]["param"] == "input[4].call_id"
        image = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/x.png"}]}
        err = await ws.error(input=[user("one"), user("other"), image], instructions=INSTRUCTIONS, tools=TOOLS)
        assert err["error"]["param"] == "input[2].content[0]"  # the renderer's error, after a partial match
    assert server.app.state.metrics.total("full_input_reuse_total") == 2
