"""A scriptable, recording :class:`~responses_cache.backends.base.Backend` for WebSocket tests.

Every ``generate`` call is recorded (the whole conversation the backend received, instructions,
tools, metadata) together with how it ended. What the backend does is scripted per request
through the create body's ``metadata`` (strings only, as the API requires):

* ``text``: the reply, streamed one word per delta (default ``"ok"``);
* ``call``: call this function instead (``args``: its JSON arguments, ``call_id`` optional);
* ``gate``: after the first delta, wait until the test releases that gate (:meth:`Gates.release`);
* ``fail_after``: raise :class:`BackendError` after that many deltas;
* ``crash``: raise a plain ``RuntimeError`` after the first delta;
* ``finish``: the finish reason (``length`` makes the response ``incomplete``).

The server runs in its own thread and event loop, so gates are released thread-safely and tests
wait for what the backend saw with :func:`until`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from responses_cache.backends.base import (
    BackendError,
    BackendEvent,
    Finish,
    GenerationRequest,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
)
from responses_cache.protocol.request import decode_input
from responses_cache.tokens.key import render_key


class Gates:
    """Named one-shot gates a backend coroutine (server loop) waits on and a test thread opens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[str] = set()
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    async def wait(self, name: str) -> None:
        event = asyncio.Event()
        with self._lock:
            if name in self._open:
                return
            self._waiters.setdefault(name, []).append((asyncio.get_running_loop(), event))
        await event.wait()

    def release(self, *names: str) -> None:
        for name in names:
            with self._lock:
                self._open.add(name)
                waiters = self._waiters.pop(name, [])
            for loop, event in waiters:
                loop.call_soon_threadsafe(event.set)

    def waiting(self, name: str) -> bool:
        with self._lock:
            return bool(self._waiters.get(name))


@dataclass
class Call:
    """One ``generate`` call as the backend saw it."""

    request: GenerationRequest
    items: list[Item]
    #: ``running`` → ``finished`` | ``cancelled`` (CancelledError) | ``closed`` (aclose) | ``failed``
    outcome: str = "running"
    deltas: int = 0

    @property
    def metadata(self) -> dict[str, str]:
        return self.request.metadata

    @property
    def tool_names(self) -> list[str]:
        return [tool.name for _, tool in self.request.tools.functions()]

    def identities(self) -> list[tuple[Any, ...]]:
        return [identity(i) for i in self.items]


@dataclass
class RecordingBackend:
    model: str = "rec-1"
    calls: list[Call] = field(default_factory=list)
    gates: Gates = field(default_factory=Gates)
    active: int = 0
    max_active: int = 0
    accepts_media: bool = True

    def models(self) -> Sequence[str]:
        return [self.model]

    def by_tag(self, tag: str) -> Call:
        """The call whose request carried ``metadata.tag == tag`` (exactly one)."""
        found = [c for c in self.calls if c.metadata.get("tag") == tag]
        assert len(found) == 1, f"{len(found)} calls tagged {tag!r}"
        return found[0]

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        call = Call(request, request.conversation.items())
        self.calls.append(call)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        meta = request.metadata
        fail_after = int(meta["fail_after"]) if "fail_after" in meta else None
        try:
            if "call" in meta:
                yield ToolCallStart(name=meta["call"], call_id=meta.get("call_id"))
                pieces = _split(meta.get("args", "{}"))
            else:
                pieces = _split(meta.get("text", "ok"))
            for i, piece in enumerate(pieces):
                if fail_after is not None and i >= fail_after:
                    raise BackendError("The engine fell over.", code="server_error")
                yield ToolCallDelta(piece) if "call" in meta else TextDelta(piece)
                call.deltas += 1
                if i == 0 and "gate" in meta:
                    await self.gates.wait(meta["gate"])
                if i == 0 and "crash" in meta:
                    raise RuntimeError("unexpected engine bug")
            if fail_after is not None and fail_after >= len(pieces):
                raise BackendError("The engine fell over.", code="server_error")
            call.outcome = "finished"
            yield Finish(meta.get("finish", "tool_calls" if "call" in meta else "stop"))  # type: ignore[arg-type]
        except asyncio.CancelledError:
            call.outcome = "cancelled"
            raise
        except GeneratorExit:
            if call.outcome == "running":
                call.outcome = "closed"
            raise
        except BaseException:
            call.outcome = "failed"
            raise
        finally:
            self.active -= 1


def _split(text: str) -> list[str]:
    """Word-sized pieces that concatenate back to ``text``."""
    pieces: list[str] = []
    current = ""
    for ch in text:
        current += ch
        if ch == " ":
            pieces.append(current)
            current = ""
    if current or not pieces:
        pieces.append(current)
    return pieces


# What the model sees of an item: the package's own definition (equal keys render the same).
identity = render_key


def expected(*inputs: Any) -> list[tuple[Any, ...]]:
    """The identities of request inputs and response outputs, as the backend should see them."""
    out: list[tuple[Any, ...]] = []
    for value in inputs:
        if isinstance(value, dict) and value.get("object") == "response":
            value = value["output"]
        out.extend(identity(i) for i in decode_input(json.dumps(value).encode()))
    return out


def user_key(text: str) -> tuple[Any, ...]:
    """The render key of a user message with ``text``."""
    return render_key(Message(role="user", content=text))


def call_key(call_id: str, name: str, arguments: str) -> tuple[Any, ...]:
    return render_key(FunctionCall(call_id=call_id, name=name, arguments=arguments))


def output_key(call_id: str, output: str) -> tuple[Any, ...]:
    return render_key(FunctionCallOutput(call_id=call_id, output=output))


async def until(predicate: Callable[[], object], what: str = "condition", timeout: float = 10.0) -> None:
    """Wait (polling) until ``predicate()`` holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)
