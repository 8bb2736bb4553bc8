"""Helpers of the llama.cpp real-engine suite (the fixtures are in ``conftest.py``)."""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
from openai import OpenAI
from responses_cache_llamacpp import LlamaCppBackend

from benchmarks.suite.llamaproc import LlamaServer
from responses_cache.engine_http import engine_transport
from responses_cache.protocol.items import Item
from responses_cache.protocol.tools import ToolSet
from responses_cache.tokens import get_renderer
from responses_cache.tokens.hf import HFRenderer
from responses_cache.tokens.hf_messages import engine_messages
from tests.websocket.wsclient import TERMINAL, check_event, check_stream

KEY = "sk-llama"
#: Each slot's context (the servers have two): Codex's first prompt is ~9k tokens.
CONTEXT = 16384
#: Family (``tests/tokens/hf_assets``) -> the architecture of its tiny model: a Qwen-style model
#: with Qwen3's real files (ChatML), a DeepSeek-style one with DeepSeek's vocabulary and template.
FAMILIES = {"qwen3-real": "Qwen2ForCausalLM", "deepseek-v4": "LlamaForCausalLM"}


class Family:
    """One family's ``llama-server``, its GGUF, the Hugging Face directory the GGUF was made from,
    and a renderer of each: ``gguf:<file>`` (the GGUF's own tokenizer and template, what a user
    of llama.cpp has) and ``hf:<directory>`` (the original files). Loaded on first use (seconds)."""

    def __init__(self, name: str, directory: pathlib.Path, gguf: pathlib.Path, server: LlamaServer) -> None:
        self.name, self.directory, self.gguf, self.server = name, directory, gguf, server
        self._renderers: dict[str, HFRenderer] = {}

    def template(self, source: str = "gguf") -> str:
        return f"gguf:{self.gguf}" if source == "gguf" else f"hf:{self.directory}"

    def renderer_of(self, source: str = "gguf") -> HFRenderer:
        if source not in self._renderers:
            renderer = get_renderer(self.template(source))
            assert isinstance(renderer, HFRenderer)
            self._renderers[source] = renderer
        return self._renderers[source]

    @property
    def renderer(self) -> HFRenderer:
        return self.renderer_of("gguf")

    def rendering(self, instructions: str | None, tools: ToolSet, items: Sequence[Item]) -> list[int]:
        """The server's own prompt for the conversation: its ``/apply-template`` (the GGUF's chat
        template, applied by llama.cpp) then its ``/tokenize`` of that text."""
        body: dict[str, Any] = {"messages": engine_messages(self.renderer.chat_messages(instructions, items))}
        chat_tools = self.renderer.chat_tools(tools)
        if chat_tools:
            body["tools"] = chat_tools
        text = self.server.post("/apply-template", body)["prompt"]
        tokens = self.server.post("/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]
        return [int(t) for t in tokens]

    def backend(self, transport: httpx.AsyncBaseTransport | None = None, **options: Any) -> LlamaCppBackend:
        return LlamaCppBackend(self.server.url, model=self.name, transport=transport, **options)

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus counters (``llamacpp:…``), by name."""
        with httpx.Client() as client:
            text = client.get(self.server.url + "/metrics").text
        return {name: float(value) for line in text.splitlines() if line and not line.startswith("#")
                for name, value in [line.rsplit(" ", 1)]}


class _Tee(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, sink: bytearray) -> None:
        self._inner, self._sink = inner, sink

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._sink += chunk
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class Recorder(httpx.AsyncBaseTransport):
    """The adapter's own transport (:func:`engine_transport`: aiohttp's pool), keeping every
    ``/completion`` request the adapter sends and the server's stream for it."""

    def __init__(self) -> None:
        self._inner = engine_transport()
        self.bodies: list[dict[str, Any]] = []
        #: The server each ``/completion`` request went to (``http://host:port``).
        self.servers: list[str] = []
        self._streams: list[bytearray] = []

    @property
    def prompts(self) -> list[list[int]]:
        return [list(body["prompt"]) for body in self.bodies]

    def chunks(self, n: int) -> list[dict[str, Any]]:
        """The JSON chunks the server streamed for request ``n``."""
        lines = bytes(self._streams[n]).decode().splitlines()
        return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]

    def sampled(self, n: int) -> list[int]:
        return [int(t) for chunk in self.chunks(n) for t in chunk.get("tokens") or ()]

    def timings(self, n: int) -> dict[str, Any]:
        """The server's ``timings`` of request ``n`` (its final chunk)."""
        return dict(self.chunks(n)[-1]["timings"])

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if request.url.path != "/completion":
            return response
        self.bodies.append(json.loads(request.content))
        self.servers.append(f"{request.url.scheme}://{request.url.host}:{request.url.port}")
        self._streams.append(bytearray())
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_Tee(response.stream, self._streams[-1]), extensions=response.extensions)

    async def aclose(self) -> None:
        await self._inner.aclose()


def sdk(http_url: str) -> OpenAI:
    return OpenAI(base_url=http_url, api_key=KEY, max_retries=0)


def turn(conn: Any, **body: Any) -> dict[str, Any]:
    """One response over an SDK WebSocket connection, every frame validated strictly."""
    conn.response.create(**{"store": False, **body})
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(conn.recv_bytes())
        check_event(event)
        assert event["type"] != "error", event
        events.append(event)
        if event["type"] in TERMINAL:
            return check_stream(events)


def wait(condition: Callable[[], bool], what: str, server: LlamaServer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}; the server's log ends:\n{server.tail(15)}"
        time.sleep(0.05)


def as_input(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the client sends it back (the SDK's ``model_dump``)."""
    return {k: v for k, v in item.items() if v is not None}
