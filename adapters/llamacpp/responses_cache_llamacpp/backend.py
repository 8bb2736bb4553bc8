"""``LlamaCppBackend``: the token log as token ids to ``llama-server``'s native ``/completion``.

The server here has rendered the conversation with the model's template and appended only the new
turn's tokens; ``llama-server`` receives exactly those ids, on the slot that holds the
conversation's previous prompt, and reuses the common prefix from that slot's cache. Per request:

* ``POST /completion`` with ``prompt`` as token ids, ``stream``, ``cache_prompt``,
  ``return_tokens`` (the sampled ids, decoded here with the renderer's encoding: the token log
  keeps exactly what was sampled), ``n_predict`` (the client's ``max_output_tokens``, capped by
  what the slot's context leaves) and ``id_slot`` (see :mod:`.slots`);
* the renderer's stop ids end the generation: the server stops by itself at its vocabulary's
  end-of-generation tokens, and a stop id it does not know ends the stream here (closing it
  cancels the server's task);
* usage from the final chunk: ``timings.prompt_n`` prompt tokens evaluated, ``timings.cache_n``
  reused from the slot's cache (``cached_tokens``), ``timings.predicted_n`` sampled;
* a prompt over the slot's context is refused before the response exists
  (``context_length_exceeded``), by this side's count or by the server's own check (it answers
  ``exceed_context_size_error`` before its HTTP status, so both are refusals);
* :meth:`LlamaCppBackend.start` waits for nothing: it reads ``/health`` (503 while the model
  loads), ``/props`` (the slot's context ``n_ctx`` and ``total_slots``) and, with ``template``
  set, proves that the server's ``/tokenize`` gives the renderer's ids; a mismatch refuses to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource

from responses_cache import (
    BackendError,
    BackendEvent,
    EngineUsage,
    Finish,
    GenerationRequest,
    Renderer,
    ToolCallStart,
    get_renderer,
)
from responses_cache.engine_http import engine_client
from responses_cache.engines import (
    ACCEPTED,
    JSON_CONTENT_TYPE,
    RETRYABLE_STATUS,
    Accepted,
    EngineUnavailable,
    IncrementalDecoder,
    batched,
    body_message,
    http_error,
    json_body,
    json_chunk,
    stream_error,
    until_accepted,
    without_marker,
)

from .slots import Replicas, SlotTable

logger = logging.getLogger("responses_cache.llamacpp")

#: Text for the tokenizer handshake: accents, CJK, an emoji, digit runs, whitespace.
_PROBE_TEXT = " Grüße, 世界 🚀 x=42; 2026-12-01 10:00, 1000 ms\n\t"
#: ``llama-server``'s error type for a prompt over the slot's context.
_CONTEXT_ERROR = "exceed_context_size_error"
#: Its ``stop_type`` -> the finish reason (``none``: the stream ended without a stop: a failure).
_FINISH = {"eos": "stop", "word": "stop", "limit": "length"}


class HandshakeError(RuntimeError):
    """The server's tokenizer does not give the renderer's ids: token-id prompts would be garbage."""


@dataclass(slots=True)
class _Server:
    """What ``/props`` says about one server."""

    context: int
    slots: SlotTable


@dataclass(slots=True)
class _Outcome:
    request: GenerationRequest
    renderer: Renderer
    parser: Any
    stops: frozenset[int]
    sampled: list[int] = field(default_factory=list)
    calls: int = 0
    stop_type: str | None = None
    stopped_here: bool = False  # a stop id the server does not end on, or tool_choice's cut
    truncated: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None


class LlamaCppBackend:
    """A :class:`responses_cache.Backend` for ``llama-server`` (one or several replicas)."""

    accepts_media = False  # the prompt is rendered to token ids on this side

    def __init__(
        self,
        base_urls: str | Sequence[str],
        *,
        model: str = "llama.cpp",
        api_key: str | None = None,
        template: str | Renderer | None = None,
        handshake: bool = True,
        context_window: int | None = None,
        slots: int | None = None,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        cooldown: float = 10.0,
        extra_body: Mapping[str, Any] | None = None,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        self.replicas = Replicas(urls, cooldown=cooldown)
        self.model = model
        #: The renderer (or its name: ``hf:<dir>``, ``chatml``…): the tokenizer handshake runs at
        #: start; without it, before the first generation of each renderer.
        self.template = template
        self.handshake = handshake
        #: The context of a slot; read from each server's ``/props`` unless set here.
        self.context_window = context_window
        self._slots_override = slots
        self.extra_body = dict(extra_body or {})
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or engine_client(
            timeout=timeout, connect_timeout=connect_timeout, headers=headers, transport=transport
        )
        self._servers: dict[str, _Server] = {}
        self._verified: set[str] = set()
        self._lock = asyncio.Lock()

    def models(self) -> Sequence[str]:
        return [self.model]

    # -- start ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Read every reachable server's context and slots, check the tokenizer (idempotent).
        Raises :class:`HandshakeError` / :class:`RuntimeError` with the reason to refuse to start."""
        async with self._lock:
            for url in self.replicas.urls:
                if url not in self._servers:
                    with contextlib.suppress(httpx.TransportError):
                        self._servers[url] = await self._read_props(url)
            if not self._servers:
                raise RuntimeError(f"no llama-server is reachable at start ({', '.join(self.replicas.urls)})")
            if self.context_window is None:
                self.context_window = min(server.context for server in self._servers.values())
            if self.template is not None and self.handshake:
                renderer = get_renderer(self.template) if isinstance(self.template, str) else self.template
                if renderer.name not in self._verified:
                    await self._handshake(renderer)

    async def _read_props(self, url: str) -> _Server:
        health = await self._client.get(url + "/health")
        if health.status_code != 200:
            raise RuntimeError(f"{url}/health answered HTTP {health.status_code}: {body_message(health.content)}")
        answer = await self._client.get(url + "/props")
        if answer.status_code == 401:
            raise RuntimeError(f"{url} refused the API key ({body_message(answer.content)}): set backend_options.api_key")
        if answer.status_code != 200:
            raise RuntimeError(f"{url}/props answered HTTP {answer.status_code}: {body_message(answer.content)}")
        props = answer.json()
        context = (props.get("default_generation_settings") or {}).get("n_ctx")
        total = self._slots_override or props.get("total_slots")
        if not isinstance(context, int) or not isinstance(total, int) or total < 1:
            raise RuntimeError(f"{url}/props has no n_ctx / total_slots: is this llama-server?")
        return _Server(context, SlotTable(total))

    async def _handshake(self, renderer: Renderer) -> None:
        """Refuse a server whose tokenizer gives other ids than the renderer for text with the
        template's special tokens."""
        probe = renderer.decode(list(renderer.stop_tokens)) + _PROBE_TEXT + renderer.decode(list(renderer.generation_prompt))
        expected = list(renderer.encode_with_specials(probe))
        checked = 0
        for url in self.replicas.urls:
            try:
                answer = await self._client.post(
                    url + "/tokenize", json={"content": probe, "add_special": False, "parse_special": True}
                )
            except httpx.TransportError:
                continue
            tokens = answer.json().get("tokens") if answer.status_code == 200 else None
            if not isinstance(tokens, list):
                continue
            checked += 1
            got = [int(t) for t in tokens]
            if got != expected:
                at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                          min(len(got), len(expected)))
                raise HandshakeError(
                    f"the llama-server at {url} tokenizes differently from the renderer {renderer.name!r}: "
                    f"at token {at} the server gives {got[at:at + 4]}, the renderer {expected[at:at + 4]}. "
                    "Token-id prompts would be garbage: configure the renderer of the served model "
                    "(renderer = \"gguf:<the model's file>\")."
                )
        if checked == 0:
            raise HandshakeError(
                "could not check the tokenizer: no llama-server answered /tokenize "
                "(set handshake = false only if you are sure the vocabularies match)"
            )
        self._verified.add(renderer.name)

    async def _ready(self, renderer: Renderer) -> None:
        if self._servers and self.context_window is not None and (
            not self.handshake or renderer.name in self._verified
        ):
            return
        try:
            await self.start()
            if self.handshake and renderer.name not in self._verified:
                async with self._lock:
                    if renderer.name not in self._verified:
                        await self._handshake(renderer)
        except (RuntimeError, httpx.HTTPError) as exc:
            raise BackendError(f"the llama.cpp backend is not ready: {exc}", "server_error") from exc

    # -- one generation ------------------------------------------------------------------------

    def prefill(self, request: GenerationRequest, renderer: Renderer) -> str:
        """Text after the generation prompt that honours ``tool_choice``: a named function or
        ``required`` start the call in the prompt (``none``: the stream ends at the first call)."""
        choice = request.tool_choice
        if choice in ("auto", "none", None):
            return ""
        name: str | None = None
        if isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
            name = str(choice["name"])
        elif choice != "required":
            raise BackendError(
                f"tool_choice {json.dumps(choice)} is not supported by the llama.cpp backend "
                "(supported: 'auto', 'none', 'required', or a named function)",
                "unsupported_value",
            )
        return renderer.tool_call_prefix(name)

    def body(self, request: GenerationRequest, ids: list[int], slot: int | None) -> dict[str, Any]:
        """The ``/completion`` request for ``ids`` (capped to what the context leaves)."""
        n_predict = request.max_output_tokens
        if self.context_window is not None:
            left = self.context_window - len(ids)
            if left <= 0:
                raise BackendError(
                    f"The prompt ({len(ids)} tokens) does not fit the model's context window "
                    f"({self.context_window} tokens).",
                    "context_length_exceeded",
                )
            n_predict = min(n_predict or left, left)
        body: dict[str, Any] = {
            "prompt": ids,
            "stream": True,
            "cache_prompt": True,
            "return_tokens": True,
            "n_predict": -1 if n_predict is None else n_predict,
        }
        if slot is not None:
            body["id_slot"] = slot
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.top_p is not None:
            body["top_p"] = request.top_p
        return {**body, **self.extra_body}

    async def open_stream(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        """Send the request and wait until the server accepts it: ``llama-server`` answers its
        HTTP status with the first result, so a prompt over the context, a refusal or no server
        reachable is raised here, before the response exists, as a plain error."""
        return await until_accepted(self._stream(request))

    def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        return without_marker(self._stream(request))

    async def _stream(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent | Accepted, None]:
        if request.prompt is None:
            raise BackendError("the llama.cpp backend needs a route with a renderer (token-id prompts)", "server_error")
        renderer = request.prompt.renderer
        await self._ready(renderer)
        prefill_text = self.prefill(request, renderer)
        prefill = list(renderer.encode_with_specials(prefill_text)) if prefill_text else []
        ids = [*request.prompt.tokens(), *prefill]
        self.body(request, ids, None)  # the context check, before any server is asked
        customs = frozenset(tool.name for tool in request.tools.customs())
        outcome = _Outcome(request, renderer, renderer.output_parser(customs),
                           frozenset(renderer.sampling_stop_tokens), sampled=list(prefill))
        for event in outcome.parser.feed(prefill_text):
            outcome.calls += isinstance(event, ToolCallStart)
            yield event
        unavailable: list[str] = []
        for url in self.replicas.ranked(request.affinity_key):
            try:
                async with contextlib.aclosing(self._attempt(url, ids, outcome)) as events:
                    async for event in events:
                        yield event
            except EngineUnavailable as exc:
                self.replicas.mark_down(url)
                unavailable.append(f"{url}: {exc}")
                continue
            break
        else:
            raise BackendError(f"no llama-server could take the request ({'; '.join(unavailable)})", "server_error")
        usage = EngineUsage(
            prompt_tokens=outcome.prompt_tokens,
            cached_tokens=outcome.cached_tokens,
            output_tokens=len(outcome.sampled) if outcome.stopped_here or outcome.output_tokens is None
            else outcome.output_tokens + len(prefill),
        )
        if outcome.truncated:  # tool_choice cut the stream: the items decide, not the ids
            yield Finish(reason="stop", usage=usage, token_ids=None)
            return
        if outcome.stopped_here:
            yield Finish(reason="stop", usage=usage, token_ids=outcome.sampled)
            return
        reason = _FINISH.get(outcome.stop_type or "")
        if reason is None:
            raise BackendError(
                f"llama-server ended the generation without a stop (stop_type {outcome.stop_type!r})", "server_error"
            )
        yield Finish(reason=reason, usage=usage, token_ids=outcome.sampled)  # type: ignore[arg-type]

    async def _server(self, url: str) -> _Server:
        server = self._servers.get(url)
        if server is None:
            try:
                server = self._servers[url] = await self._read_props(url)
            except (RuntimeError, httpx.TransportError) as exc:
                raise EngineUnavailable(BackendError(str(exc) or type(exc).__name__, "server_error")) from exc
        return server

    async def _attempt(self, url: str, ids: list[int], outcome: _Outcome) -> AsyncGenerator[BackendEvent | Accepted, None]:
        """One try on one server. Raises :class:`EngineUnavailable` only before any output."""
        server = await self._server(url)
        headers = {"X-Request-Id": outcome.request.response_id, **outcome.request.trace_context}
        decoder = IncrementalDecoder(outcome.renderer.encoding)
        parser = outcome.parser
        streamed = stopped = False
        slot = server.slots.acquire(outcome.request.affinity_key)
        try:
            body = self.body(outcome.request, ids, slot)
            content, headers = json_body(body), {**headers, **JSON_CONTENT_TYPE}
            async with self._client.stream("POST", url + "/completion", content=content, headers=headers) as response:
                if response.status_code != 200:
                    raise self._refused(response.status_code, await response.aread(), response.headers)
                self.replicas.mark_up(url)
                yield ACCEPTED
                # What arrived together is decoded, parsed and yielded once (see ``batched``).
                async with contextlib.aclosing(batched(EventSource(response).aiter_sse())) as batches:
                    async for batch in batches:
                        new: list[int] = []
                        final = False
                        failure: BackendError | None = None  # raised once what came before it is out
                        for sse in batch:
                            if not sse.data:
                                continue
                            try:
                                chunk = json_chunk(sse.data, "llama-server")
                            except BackendError as exc:
                                failure = exc
                                break
                            if "error" in chunk:
                                failure = stream_error(chunk)
                                break
                            tokens = [int(t) for t in chunk.get("tokens") or ()]
                            if stopped and tokens:
                                outcome.stopped_here = True  # the server goes on after a stop id of ours
                                final = True
                                break
                            end = next((i for i, t in enumerate(tokens) if t in outcome.stops), None)
                            if end is not None:
                                stopped, tokens = True, tokens[: end + 1]
                            new.extend(tokens)
                            if chunk.get("stop"):
                                self._read_final(chunk, outcome)
                                final = True
                                break
                        if new:
                            streamed = True
                            outcome.sampled.extend(new)
                            for event in parser.feed(decoder.feed(new)):
                                if isinstance(event, ToolCallStart):
                                    outcome.calls += 1
                                    request = outcome.request
                                    if request.tool_choice == "none" or (outcome.calls > 1 and not request.parallel_tool_calls):
                                        outcome.truncated = True  # no call, or one call only: stop here
                                        return
                                yield event
                        if failure is not None:
                            raise failure
                        if final:
                            break
        except httpx.TransportError as exc:
            if streamed:
                raise BackendError(f"the connection to llama-server broke mid-stream: {exc}", "server_error") from exc
            raise EngineUnavailable(BackendError(str(exc) or type(exc).__name__, "server_error")) from exc
        finally:
            server.slots.release(slot)
        if outcome.stop_type is None and not outcome.stopped_here:
            raise BackendError("llama-server's stream ended without its final chunk", "server_error")
        for event in parser.feed(decoder.close()):
            yield event
        for event in parser.close():
            yield event

    @staticmethod
    def _read_final(chunk: Mapping[str, Any], outcome: _Outcome) -> None:
        outcome.stop_type = str(chunk.get("stop_type") or "none")
        timings = chunk.get("timings") or {}
        evaluated, cached, predicted = timings.get("prompt_n"), timings.get("cache_n"), timings.get("predicted_n")
        if isinstance(evaluated, int) and isinstance(cached, int):
            outcome.prompt_tokens, outcome.cached_tokens = evaluated + cached, cached
        if isinstance(predicted, int):
            outcome.output_tokens = predicted

    @staticmethod
    def _refused(status: int, content: bytes, headers: Mapping[str, str]) -> Exception:
        """A non-200 answer: retryable on another server (502/503/504), else the error."""
        try:
            error = json.loads(content).get("error") or {}
        except (ValueError, AttributeError):
            error = {}
        if isinstance(error, Mapping) and error.get("type") == _CONTEXT_ERROR:
            return BackendError(
                f"The prompt does not fit the model's context window: {error.get('message')}", "context_length_exceeded"
            )
        failure = http_error(status, content, headers)
        return EngineUnavailable(failure) if status in RETRYABLE_STATUS else failure

    async def aclose(self) -> None:
        await self._client.aclose()
