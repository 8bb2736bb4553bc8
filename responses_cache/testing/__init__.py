"""A testing kit for people who write their own stages and backends.

* :class:`RecordingBackend` wraps any backend and records every :class:`GenerationRequest`, so a
  test can assert exactly what the engine was given (context fidelity).
* :class:`ScriptedBackend` replays scripted event lists, one per generation.
* :func:`context_of` reduces a request to what determines the model's context (ids and statuses
  do not), so two requests can be compared.
* :func:`run_turns` runs turns through a pipeline (or an app) without sockets.
* :class:`FakeVllm`, :class:`FakeSglang`, :class:`FakeCerebras` (from
  :mod:`responses_cache.testing.fake_engines`): realistic engine fakes as ASGI apps, for adapter tests.
* :func:`check_hook_equivalence` / :func:`assert_incremental_equals_full` check a hook's
  incremental contract: its verdict with carried state equals its verdict on the full history.
* :func:`serve_in_thread` runs an app under uvicorn in a thread; :func:`serve_in_process` runs
  ``responses-cache serve`` in a child process (for tests that kill it, or share a store).
* :class:`WebhookReceiver` is a billing webhook on a loopback port that can be told to fail.
* :func:`start_once` runs a backend's start-up checks and closes it.
* :func:`steer_mid_answer` steers a response a gated fake engine is streaming, over a WebSocket;
  :func:`wait_for` waits (with a deadline) for what another thread or process reaches on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ..backends.base import Backend, BackendEvent, Finish, GenerationRequest, TextDelta
from ..backends.simulated import SimulatedConfig, SimulatedEngine
from ..core.responder import Responder
from ..core.runtime import DEFAULT_MAX_MESSAGE_BYTES, Service
from ..pipeline.hooks import Hook, HookContext
from ..pipeline.turn import Lineage, Turn
from ..protocol import events as ev
from ..protocol.codec import encode
from ..protocol.errors import ResponsesError
from ..protocol.items import Item
from ..storage.references import ItemIndex
from ..storage.state import ResponseState
from ..tokens.key import render_key
from .fake_engines import Behaviour as Behaviour
from .fake_engines import ChatReply as ChatReply
from .fake_engines import FakeCerebras as FakeCerebras
from .fake_engines import FakeSglang as FakeSglang
from .fake_engines import FakeVllm as FakeVllm

if TYPE_CHECKING:
    from ..tokens.base import Renderer


class RecordingBackend:
    """Records each request, then delegates to ``inner`` (an instant simulated engine by default).
    Everything else is ``inner``'s -- its lifecycle (``start``, ``aclose``), context window, media
    support, and a preflight ``open_stream`` (whose requests are recorded too) -- so a real
    adapter wrapped in it starts, checks and streams as it would alone."""

    def __init__(self, inner: Backend | None = None) -> None:
        self.inner: Backend = inner or SimulatedEngine(SimulatedConfig(instant=True))
        self.requests: list[GenerationRequest] = []
        self.accepts_media = bool(getattr(self.inner, "accepts_media", True))

    def models(self) -> Sequence[str]:
        return self.inner.models()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self.requests.append(request)
        async for event in self.inner.generate(request):
            yield event

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being made): nothing to delegate to
            raise AttributeError(name)
        found = getattr(self.inner, name)
        if name != "open_stream":
            return found

        async def open_stream(request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
            self.requests.append(request)
            opened: AsyncGenerator[BackendEvent, None] = await found(request)
            return opened

        return open_stream


class ScriptedBackend:
    """Yields ``scripts[i]`` for the i-th generation (the last script repeats)."""

    accepts_media = True

    def __init__(
        self, scripts: Sequence[Sequence[BackendEvent]], models: Sequence[str] = ("sim-1",)
    ) -> None:
        if not scripts:
            raise ValueError("ScriptedBackend needs at least one script")
        self.scripts = [list(s) for s in scripts]
        self._models = list(models)
        self.calls = 0

    def models(self) -> Sequence[str]:
        return self._models

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        script = self.scripts[min(self.calls, len(self.scripts) - 1)]
        self.calls += 1
        for event in script:
            yield event
        if not script or not isinstance(script[-1], Finish):
            yield Finish()


#: What the model sees of an item: its render key (see :func:`responses_cache.tokens.key.render_key`;
#: equal keys render to the same tokens).


class EndlessBackend:
    """Streams text deltas until it is closed: for testing that cancellation reaches the engine.
    ``open`` counts the generators still running (0 once every cancelled turn closed its
    stream), ``started`` those ever started and ``closed`` those closed."""

    accepts_media = True

    def __init__(self, models: Sequence[str] = ("sim-1",)) -> None:
        self._models = list(models)
        self.open = 0
        self.started = 0
        self.closed = 0

    def models(self) -> Sequence[str]:
        return self._models

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self.open += 1
        self.started += 1
        try:
            while True:
                await asyncio.sleep(0.001)
                yield TextDelta("x ")
        finally:
            self.open -= 1
            self.closed += 1


class GatedBackend:
    """Streams ``"partial "``, then holds its request open until :meth:`release` (then ``"done"``):
    for testing responses that run while the test looks on (background responses, cancel).
    ``started`` and ``aborted`` (the request closed while held) are ``threading.Event``s, so a
    test can wait on them while the server runs in another thread (:func:`serve_in_thread`)."""

    accepts_media = False

    def __init__(self, models: Sequence[str] = ("gate-1",)) -> None:
        self._models = list(models)
        self.started = threading.Event()
        self.aborted = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gate: asyncio.Event | None = None

    def models(self) -> Sequence[str]:
        return self._models

    def release(self) -> None:
        """Let the held request finish (from any thread)."""
        assert self._loop is not None and self._gate is not None, "no request is held"
        self._loop.call_soon_threadsafe(self._gate.set)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self._loop, self._gate = asyncio.get_running_loop(), asyncio.Event()
        finished = False
        try:
            yield TextDelta("partial ")
            self.started.set()
            await self._gate.wait()
            yield TextDelta("done")
            finished = True
            yield Finish()
        finally:
            if not finished:
                self.aborted.set()


def context_of(request: GenerationRequest) -> dict[str, Any]:
    """The parts of a request that decide what the model sees."""
    prompt = list(request.prompt.tokens()) if request.prompt is not None else None
    return {
        "instructions": request.instructions,
        "tools": request.tools.fingerprint,
        "items": [render_key(i) for i in request.conversation.items()],
        "prompt": prompt,
    }


# --------------------------------------------------------------------------------------------
# Running turns without sockets, and checking hooks' incremental contract.
# --------------------------------------------------------------------------------------------

TurnInput = str | Sequence[Item] | Sequence[Mapping[str, Any]] | Mapping[str, Any]


@dataclass(slots=True)
class TurnResult:
    """One turn run by :func:`run_turns`: its events (as the wire would carry them), the child
    state (``None`` when the turn was rejected before ``response.created``) and the error."""

    events: list[dict[str, Any]]
    state: ResponseState | None
    error: ResponsesError | None = None

    @property
    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    @property
    def response(self) -> dict[str, Any] | None:
        return (
            self.events[-1]["response"] if self.events and "response" in self.events[-1] else None
        )


def _body(turn: TurnInput, model: str) -> dict[str, Any]:
    if isinstance(turn, Mapping):
        body = dict(turn)
        body.setdefault("model", model)
        return body
    if isinstance(turn, str):
        return {"model": model, "input": turn}
    return {
        "model": model,
        "input": [msgspec.to_builtins(i) if not isinstance(i, Mapping) else dict(i) for i in turn],
    }


async def run_turns(
    target: Any,
    turns: Sequence[TurnInput],
    *,
    model: str | None = None,
    tenant: str = "test",
    transport: Literal["http", "websocket"] = "http",
    lane: str | None = None,
    backend: Backend | None = None,
    parent: ResponseState | None = None,
    chain: bool = True,
) -> list[TurnResult]:
    """Run ``turns`` through a pipeline, each continuing the last accepted one, without sockets.

    ``target``: an app from :func:`~responses_cache.create_app`, a
    :class:`~responses_cache.Service` or a bare
    :class:`~responses_cache.pipeline.pipeline.Pipeline` (served by ``backend``, an instant
    simulated engine by default). A turn is a string (one user message), a list of items (or of
    item dicts), or a whole request body. A turn rejected before generation (a ``before`` hook's
    flag, a validation error) is recorded with its error and the next turn continues the last
    accepted response, as a client would.
    """
    from ..backends.routing import Route
    from ..pipeline.pipeline import Pipeline
    from ..protocol.request import decode_create, decode_input
    from ..protocol.tools import parse_tools

    service = getattr(getattr(target, "state", None), "service", None) or target
    if isinstance(service, Service):
        service = service.core
    core: Responder | None = None
    if isinstance(service, Pipeline):
        pipeline = service
        engine = backend or SimulatedEngine(SimulatedConfig(instant=True))
        route = Route(name="test", model=model or engine.models()[0], backend=engine, renderer=None)
        resolve: Any = lambda _model: route  # noqa: E731
        default_model = route.model
    else:
        core = service
        pipeline = service.pipeline
        router = service.router
        default_model = model or router.models()[0]
        resolve = lambda m: router.resolve(m, tenant)  # noqa: E731
    results: list[TurnResult] = []
    for i, spec in enumerate(turns):
        body = _body(spec, model or default_model)
        if chain and parent is not None and "previous_response_id" not in body:
            body["previous_response_id"] = parent.id
        events: list[dict[str, Any]] = []

        async def emit(event: ev.Event, sink: list[dict[str, Any]] = events) -> None:
            sink.append(msgspec.json.decode(encode(event)))  # what a client receives

        try:
            request = decode_create(msgspec.json.encode(body))
            turn = Turn(
                request=request,
                items=decode_input(request.input),
                tools=parse_tools(request.tools),
                tenant=tenant,
                transport=transport,
                lane=lane,
                response_id=f"resp_test{i:04d}",
                created_at=0.0,
            )
            route = resolve(request.model)
            if core is not None:  # the service decides the parent, as for a client's connection
                start = await core.parent_of(turn, route, _LastAccepted(parent if chain else None, request.previous_response_id))
                state = await core.run(turn, start, route, emit)
            else:
                state = await pipeline.run(turn, Lineage.first(turn, parent if chain else None), route, emit)
        except ResponsesError as exc:
            results.append(TurnResult(events, None, exc))
            continue
        results.append(TurnResult(events, state))
        if state.response.status != "failed":
            parent = state
    return results


class _LastAccepted:
    """The connection cache of :func:`run_turns`: the last accepted response, nothing else."""

    def __init__(self, state: ResponseState | None, wanted: str | None) -> None:
        self.state = state if state is not None and state.id == wanted else None
        self.items = ItemIndex(65_536)

    def cached_parent(self) -> tuple[ResponseState, bool] | None:
        return (self.state, False) if self.state is not None else None

    def full_input_match(
        self, items: list[Item], tools_fingerprint: bytes, renderer: Renderer | None
    ) -> tuple[ResponseState, int] | None:
        return None


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Where a hook's incremental verdict differed from its verdict on the full history."""

    turn: int
    field: str
    incremental: Any
    full: Any

    def __str__(self) -> str:
        return f"turn {self.turn}: {self.field} incremental={self.incremental!r} full={self.full!r}"


TEST_CONTEXT = HookContext(
    tenant="test", model="test-model", response_id="resp_test", lane=None, transport="http"
)


async def hook_equivalence(
    hook: Hook,
    turns: Sequence[Sequence[Item]],
    *,
    ctx: HookContext = TEST_CONTEXT,
    keep_flagged: bool | None = None,
) -> list[Mismatch]:
    """Run ``hook`` turn by turn with its carried state, and once over the full history at each
    turn; return every difference (``flagged``, ``code``, ``message`` and the returned ``items``,
    compared with the tail of the full run's items).

    A flagged turn is dropped from the history when the hook is a ``before`` hook (the pipeline
    rejects it and the client continues the previous response) and kept for an ``alongside`` hook
    (the stopped response can be continued); ``keep_flagged`` overrides that.
    """
    keep = hook.phase == "alongside" if keep_flagged is None else keep_flagged
    history: list[Item] = []
    state: Any = None
    mismatches: list[Mismatch] = []
    for n, new in enumerate(turns):
        new = list(new)
        inc = await hook(ctx, new, state)
        full = await hook(ctx, [*history, *new], None)
        for name in (
            ("flagged", "code", "message") if (inc.flagged or full.flagged) else ("flagged",)
        ):
            a, b = getattr(inc, name), getattr(full, name)
            if a != b:
                mismatches.append(Mismatch(n, name, a, b))
        inc_items = [render_key(i) for i in (inc.items if inc.items is not None else new)]
        full_all = list(full.items) if full.items is not None else [*history, *new]
        full_items = [render_key(i) for i in full_all[len(history) :]]
        if not inc.flagged and inc_items != full_items:
            mismatches.append(Mismatch(n, "items", inc_items, full_items))
        if inc.flagged and not keep:
            continue
        state = inc.state
        history.extend(inc.items if inc.items is not None else new)
    return mismatches


def _run_sync(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError("called from a running event loop: await hook_equivalence(...) instead")


def start_once(backend: Any) -> None:
    """``backend.start()`` in an event loop of its own, then ``backend.aclose()`` whatever the
    start did (a test of start-up checks: the handshake, the context read). Raises what the
    start raised."""

    async def run() -> None:
        try:
            await backend.start()
        finally:
            await backend.aclose()

    asyncio.run(run())


def check_hook_equivalence(
    hook: Hook, turns: Sequence[Sequence[Item]], *, keep_flagged: bool | None = None
) -> list[Mismatch]:
    """Synchronous :func:`hook_equivalence` (for plain and hypothesis tests)."""
    result: list[Mismatch] = _run_sync(hook_equivalence(hook, turns, keep_flagged=keep_flagged))
    return result


def assert_incremental_equals_full(
    hook: Hook,
    conversations: Iterable[Sequence[Sequence[Item]]],
    *,
    keep_flagged: bool | None = None,
) -> None:
    """Assert that ``hook`` is incremental-equals-full on every conversation (a list of turns)."""
    failures: list[str] = []
    for c, turns in enumerate(conversations):
        failures.extend(
            f"conversation {c}, {m}"
            for m in check_hook_equivalence(hook, turns, keep_flagged=keep_flagged)
        )
    assert not failures, f"{getattr(hook, 'name', hook)!r} is not incremental:\n" + "\n".join(
        failures
    )


class LogicalClock:
    """Time that moves only when a test (or an awaited :meth:`sleep`) moves it: a ``clock``
    for the rate limiters and input budgets, so their tests count instead of timing."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        #: Every :meth:`sleep`'s argument, in order.
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)  # a real sleep lets others run: so does this one


class WebhookReceiver:
    """A billing webhook (``--billing-webhook``, :class:`~responses_cache.billing.WebhookSink`)
    on a free loopback port, served from a thread; a context manager that stops it.

    Every POST is kept in :attr:`requests` (headers, parsed body). While :attr:`down`, or for the
    next :attr:`fail_next` requests, it answers :attr:`fail_status` (with ``Retry-After:``
    :attr:`retry_after` when set) and counts :attr:`failures`; otherwise it answers 200 and files
    each record of the batch under its ``response_id`` in :attr:`received` -- every delivery, so
    that a test can tell a record delivered twice (an acknowledgement lost) from one delivered once.
    Change the settings under :attr:`lock` when the server is in use."""

    def __init__(self, path: str = "/billing") -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.fail_next = 0
        self.fail_status = 503
        self.retry_after: str | None = None
        self.down = False
        self.failures = 0
        self.requests: list[tuple[dict[str, str], Any]] = []
        self.received: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    receiver.requests.append((dict(self.headers.items()), body))
                    failing = receiver.down or receiver.fail_next > 0
                    if failing:
                        receiver.failures += 1
                        receiver.fail_next = max(0, receiver.fail_next - 1)
                    else:
                        for record in body:
                            receiver.received.setdefault(str(record["response_id"]), []).append(record)
                self.send_response(receiver.fail_status if failing else 200)
                if failing and receiver.retry_after is not None:
                    self.send_header("Retry-After", receiver.retry_after)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def close(self) -> None:
        """Stop serving and wait for the server's thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Return once ``condition()`` holds, polling; fail with ``what`` after ``timeout`` seconds
    (a deadline, not a measurement): for state that a server or a fake engine in another thread
    or process reaches on its own, after the client has seen all it will see."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} (waited {timeout:g} s)")
        time.sleep(0.01)


def steer_mid_answer(
    ws_url: str, gate: threading.Semaphore, *, model: str, input: str, steer: str, timeout: float = 30.0
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create a response over a new WebSocket, send ``response.steer`` with ``steer`` once its
    first text delta arrives, and return the terminal ``response`` objects of the target and of
    its successor. The engine is a fake whose stream for the target is held by ``gate``
    (:class:`Behaviour` ``gate``): the gate is released once when the steer is accepted, so the
    steer always lands mid-answer and the engine's next token comes after it. Needs the
    ``websockets`` package (the ``test`` extra)."""
    from websockets.sync.client import connect

    with connect(ws_url, max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": model, "input": input}))
        target = None
        while (event := json.loads(ws.recv(timeout=timeout)))["type"] != "response.output_text.delta":
            if event["type"] == "response.created":
                target = event["response"]["id"]
            elif event["type"] in ("error", "response.failed", "response.completed", "response.incomplete"):
                raise AssertionError(f"the target ended before its first text delta: {event}")
        assert target is not None, "no response.created before the first delta"
        ws.send(json.dumps({"type": "response.steer", "previous_response_id": target, "input": steer}))
        ends: list[dict[str, Any]] = []
        while len(ends) < 2:
            event = json.loads(ws.recv(timeout=timeout))
            if event["type"] == "response.steer.accepted":
                gate.release()
            elif event["type"] == "error":
                raise AssertionError(f"the steer was refused: {event}")
            elif event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                ends.append(event["response"])
    target_end, successor = ends
    assert target_end["id"] == target, "the target did not end first"
    return target_end, successor


class _Address:
    """The base URLs of a server listening on ``host``:``port``."""

    host: str
    port: int

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/responses"


@dataclass
class LiveServer(_Address):
    """A server running in a background thread on a free loopback port (see :func:`serve_in_thread`)."""

    app: Any
    host: str
    port: int
    _server: Any = None
    _thread: threading.Thread | None = None

    def stop(self) -> None:
        """Ask uvicorn to exit (lifespan shutdown runs) and wait for its thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (another process may take it before it is used)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def wait_listening(proc: subprocess.Popen[Any], host: str, port: int, timeout: float) -> bool:
    """Wait until something accepts TCP connections on ``host:port`` (``True``); ``False`` as soon
    as ``proc`` has exited or ``timeout`` seconds have passed without it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return True
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> LiveServer:
    """Run ``app`` under uvicorn in a daemon thread and return once it accepts connections."""
    import uvicorn

    port = port or free_port(host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", ws_max_size=DEFAULT_MAX_MESSAGE_BYTES, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    return LiveServer(app, host, port, server, thread)


@dataclass
class ServeProcess(_Address):
    """``responses-cache serve`` in a child process (see :func:`serve_in_process`)."""

    proc: subprocess.Popen[bytes]
    host: str
    port: int
    #: The child's stdout and stderr (a file: a chatty server never blocks on a full pipe).
    log: Path
    #: The log is a temporary file of ours, removed once the child has ended.
    temporary_log: bool = False

    def output(self) -> str:
        """What the child has written so far."""
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Return once the server accepts connections; :class:`RuntimeError` (with its output)
        if it exits or has not started within ``timeout`` seconds."""
        if not wait_listening(self.proc, self.host, self.port, timeout):
            output = self.output()
            self.kill()
            raise RuntimeError(f"responses-cache serve did not start:\n{output}")

    def stop(self, timeout: float = 20.0) -> None:
        """A graceful stop (SIGTERM: connections drain, billing flushes); killed after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.kill()

    def kill(self) -> None:
        """SIGKILL (as a crash would end it, unless it has ended already), and wait for it to be
        gone; a temporary log goes with it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.temporary_log:
            self.log.unlink(missing_ok=True)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_process(
    *args: str,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    host: str = "127.0.0.1",
    wait: bool = True,
    timeout: float = 60.0,
) -> ServeProcess:
    """Start ``responses-cache serve --host HOST --port <free> *args`` in a child process (this
    Python, ``env`` or this process's environment) and return once it accepts connections
    (``wait=False``: at once; call :meth:`ServeProcess.wait_ready`, to start several together)."""
    temporary = log is None
    if log is None:
        handle, name = tempfile.mkstemp(prefix="responses-cache-serve-", suffix=".log")
        os.close(handle)
        log = Path(name)
    port = free_port(host)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "responses_cache.server.cli", "serve", "--host", host, "--port", str(port), *args],
            env=dict(env) if env is not None else None, stdout=out, stderr=subprocess.STDOUT,
        )
    server = ServeProcess(proc, host, port, log, temporary)
    if wait:
        server.wait_ready(timeout)
    return server
