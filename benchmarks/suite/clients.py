"""Benchmark clients over loopback: WebSocket mode (``websockets``) and HTTP + SSE (``httpx``).

Each client sends one ``response.create`` body and returns a :class:`TurnTiming` with the time to
the first server event (``response.created``: everything the server does before generation), to
the first ``response.output_text.delta`` (the first output token a user sees), to the first delta
of any kind (text, reasoning, tool-call arguments: the first generated token, wherever the model's
parser put it) and to the terminal event. Bodies are encoded before the clock starts; events are only probed for
their ``type`` (the terminal event is decoded in full), so client-side parsing stays small.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx
import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
_DELTA = "response.output_text.delta"


class _EventHead(msgspec.Struct):
    type: str = ""


_probe = msgspec.json.Decoder(_EventHead)
_encode = msgspec.json.Encoder().encode


class TurnError(Exception):
    """The server answered a turn with an error (or a failed response)."""


@dataclass(frozen=True, slots=True)
class TurnTiming:
    first_event_s: float
    completed_s: float
    events: int
    response: dict[str, Any]
    #: Time to the first ``response.output_text.delta``; 0.0 when there was none.
    first_delta_s: float = 0.0
    #: Time to the first ``*.delta`` event of any kind; 0.0 when there was none.
    first_output_s: float = 0.0

    @property
    def id(self) -> str:
        return str(self.response["id"])

    @property
    def output(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.response.get("output", [])
        return out

    @property
    def input_tokens(self) -> int:
        usage = self.response.get("usage") or {}
        return int(usage.get("input_tokens", 0))

    @property
    def output_tokens(self) -> int:
        usage = self.response.get("usage") or {}
        return int(usage.get("output_tokens", 0))

    def call_id(self) -> str | None:
        """The ``call_id`` of the last function call in the output, if any."""
        for item in reversed(self.output):
            if item.get("type") == "function_call":
                return str(item["call_id"])
        return None


def _finish(
    kind: str, data: bytes | str, t0: float, first: float, events: int, delta: float = 0.0, output: float = 0.0
) -> TurnTiming:
    payload: dict[str, Any] = msgspec.json.decode(data)
    if kind == "error":
        raise TurnError(str(payload.get("error")))
    response: dict[str, Any] = payload["response"]
    if kind == "response.failed":
        raise TurnError(str(response.get("error")))
    return TurnTiming(
        first - t0, time.perf_counter() - t0, events, response, delta - t0 if delta else 0.0, output - t0 if output else 0.0
    )


def ws_frame(body: dict[str, Any]) -> str:
    """A ``response.create`` frame for ``body`` (encoded once, before timing)."""
    return _encode({"type": "response.create", **body}).decode()


def http_body(body: dict[str, Any]) -> bytes:
    return _encode({**body, "stream": True})


class WSClient:
    """A WebSocket-mode connection driven turn by turn from synchronous code.

    It runs the asyncio ``websockets`` client on a private event loop: the sync client hands every
    frame from a reader thread to the caller, which added about 0.5 ms per turn on this 2-core
    machine (measured with a warm-up-only turn: p50 0.99 ms sync vs 0.49 ms asyncio).
    """

    def __init__(self, url: str, api_key: str = "sk-bench") -> None:
        self._loop = asyncio.new_event_loop()
        self._ws: ClientConnection = self._loop.run_until_complete(
            ws_connect(
                url,
                max_size=None,
                compression=None,
                ping_interval=None,  # its loop runs only during a turn: a pong would be read late
                additional_headers={"Authorization": f"Bearer {api_key}"},
                open_timeout=60,
            )
        )

    def turn(self, frame: str) -> TurnTiming:
        return self._loop.run_until_complete(ws_turn_async(self._ws, frame))

    def pump(self) -> None:
        """Run the connection's loop once, off the clock: it answers the server's keepalive pings
        (its loop runs only during a turn, and a connection left unread through other clients'
        long turns is closed by the server's ping timeout)."""
        self._loop.run_until_complete(asyncio.sleep(0))

    def close(self) -> None:
        self._loop.run_until_complete(self._ws.close())
        self._loop.close()

    def __enter__(self) -> WSClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class HTTPClient:
    """A synchronous HTTP client streaming ``POST /v1/responses`` as SSE (keep-alive connection)."""

    def __init__(self, base_url: str, api_key: str = "sk-bench") -> None:
        self._client = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}", "content-type": "application/json"},
            timeout=httpx.Timeout(600.0),
        )

    def turn(self, content: bytes) -> TurnTiming:
        t0 = time.perf_counter()
        with self._client.stream("POST", "/responses", content=content) as response:
            if response.status_code != 200:
                response.read()
                raise TurnError(f"HTTP {response.status_code}: {response.text[:500]}")
            first = delta = output = 0.0
            events = 0
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    if not first and line:
                        first = time.perf_counter()
                    continue
                if not first:
                    first = time.perf_counter()
                events += 1
                data = line[5:].strip()
                kind = _probe.decode(data).type
                if not output and kind.endswith(".delta"):
                    output = time.perf_counter()
                if kind == _DELTA and not delta:
                    delta = time.perf_counter()
                if kind in _TERMINAL:
                    return _finish(kind, data, t0, first, events, delta, output)
        raise TurnError("the SSE stream ended without a terminal event")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HTTPClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SocketHTTPClient:
    """``POST /v1/responses`` (SSE) over one keep-alive HTTP/1.1 socket, parsed by hand.

    httpx (h11, line iteration) costs the client about a millisecond per streamed turn on this
    machine, which a benchmark of the *server* would charge to HTTP; this client, like the
    asyncio WebSocket client, keeps the client's own share small. Only what the server sends is
    supported: a status line, headers, and a chunked body of server-sent events.
    """

    def __init__(self, base_url: str, api_key: str = "sk-bench") -> None:
        rest = base_url.split("://", 1)[1]
        hostport, _, prefix = rest.partition("/")
        host, _, port = hostport.partition(":")
        self._address = (host, int(port or 80))
        self._path = ("/" + prefix).rstrip("/") + "/responses"
        self._sock = self._connect()
        self._head = (
            f"POST {self._path} HTTP/1.1\r\nhost: {hostport}\r\nauthorization: Bearer {api_key}\r\n"
            "content-type: application/json\r\naccept: text/event-stream\r\n"
        ).encode()
        self._buf = b""

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self._address, timeout=600)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _reopen_if_closed(self) -> None:
        """Reconnect if the server closed the idle connection (its keep-alive timeout), as a
        connection pool does before it reuses one; checked before the clock starts."""
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
            closed = bool(readable) and self._sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            closed = True
        if closed:
            self._sock.close()
            self._sock, self._buf = self._connect(), b""

    def _fill(self) -> None:
        data = self._sock.recv(1 << 20)
        if not data:
            raise TurnError("the server closed the connection")
        self._buf += data

    def _until(self, marker: bytes) -> bytes:
        while True:
            at = self._buf.find(marker)
            if at >= 0:
                out, self._buf = self._buf[:at], self._buf[at + len(marker) :]
                return out
            self._fill()

    def _exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._fill()
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def turn(self, content: bytes) -> TurnTiming:
        self._reopen_if_closed()
        t0 = time.perf_counter()
        self._sock.sendall(self._head + b"content-length: %d\r\n\r\n" % len(content) + content)
        head = self._until(b"\r\n\r\n").split(b"\r\n")
        status = int(head[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(b":") for h in head[1:])}
        if headers.get(b"transfer-encoding") != b"chunked":
            body = self._exactly(int(headers.get(b"content-length", b"0")))
            raise TurnError(f"HTTP {status}: {body[:500]!r}")
        first = delta = output = 0.0
        events = 0
        pending = b""
        result: TurnTiming | None = None
        while True:
            size = int(self._until(b"\r\n").split(b";")[0], 16)
            chunk = self._exactly(size)
            self._exactly(2)
            if size == 0:
                break
            if not first:
                first = time.perf_counter()
            pending += chunk
            *complete, pending = pending.split(b"\n\n")
            for block in complete:
                data = next((line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")), b"")
                if not data:
                    continue
                events += 1
                kind = _probe.decode(data).type
                if not output and kind.endswith(".delta"):
                    output = time.perf_counter()
                if kind == _DELTA and not delta:
                    delta = time.perf_counter()
                if kind in _TERMINAL and result is None:
                    result = _finish(kind, data, t0, first, events, delta, output)
        if result is None:
            raise TurnError("the SSE stream ended without a terminal event")
        return result

    def close(self) -> None:
        self._sock.close()


async def ws_turn_async(ws: ClientConnection, frame: str) -> TurnTiming:
    """One turn on an asyncio ``websockets`` connection (the scale benchmark)."""
    t0 = time.perf_counter()
    await ws.send(frame)
    first = delta = output = 0.0
    events = 0
    while True:
        data = await ws.recv()
        if not events:
            first = time.perf_counter()
        events += 1
        kind = _probe.decode(data).type
        if not output and kind.endswith(".delta"):
            output = time.perf_counter()
        if kind == _DELTA and not delta:
            delta = time.perf_counter()
        if kind in _TERMINAL:
            return _finish(kind, data, t0, first, events, delta, output)
