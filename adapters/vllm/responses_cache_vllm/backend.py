"""``EngineBackend``: token-id prompts to vLLM or SGLang, over replicas, with fail-over.

The server has already rendered the conversation (and appended only the new turn's tokens), so
the engine receives exactly the prompt the connection cache holds and its prefix cache sees an
exact prefix. Per request:

* **endpoint** (see :mod:`.dialects`): vLLM ``/inference/v1/generate`` (tokens out, decoded here
  with the renderer's encoding) or ``/v1/completions``; SGLang ``/generate`` (cumulative frames)
  or ``/v1/completions``. ``endpoint="auto"`` takes the tokens-in route when the engine serves it
  (probed at start), else the completions route.
* **placement** (see :mod:`.placement`): rendezvous hashing of the conversation's affinity key
  over the replicas; a refused connection or a 502/503/504 before the first token moves the
  request to the next replica; routing headers (``X-SMG-Routing-Key``, ``X-Session-ID``,
  ``X-data-parallel-rank``) derived from the same key; a per-tenant ``cache_salt``.
* **max tokens**: the client's ``max_output_tokens``, capped by what the context window leaves
  (the engine's ``max_model_len``, read from ``/v1/models`` at start, or ``context_window``).
* **start**: :meth:`EngineBackend.start` (run by the server's lifespan) probes the endpoint,
  reads the context window and, with ``template`` set, proves that the engine's tokenizer gives
  the renderer's ids (``/tokenize``); a mismatch refuses to start.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import os
from array import array
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
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
    finish_error,
    http_error,
    json_body,
    json_chunk,
    until_accepted,
    without_marker,
)

from .dialects import DIALECTS, PREFERENCE, Dialect, Params, Step
from .placement import Replicas, data_parallel_rank

logger = logging.getLogger("responses_cache.vllm")

_FINISH = {"stop": "stop", "length": "length", "content_filter": "content_filter"}
#: Statuses that say the tokens-in route is not served: missing (404/405) or disabled (403).
_NOT_SERVED = frozenset({403, 404, 405})
_ENABLE_HINT = {
    "vllm": "To use vLLM's tokens-in route (/inference/v1/generate), start vllm serve with --enable-scale-out",
    "sglang": "SGLang serves /generate on every server: check the URL",
}
#: Text for the tokenizer handshake: accents, CJK, an emoji, digit runs (tokenizers that split
#: numbers differently: Qwen2 one digit at a time, Llama 3 up to three), whitespace.
_PROBE_TEXT = " Grüße, 世界 🚀 x=42; 2026-12-01 10:00, 1000 ms\n\t"


class _RouteDisabled(Exception):
    """The tokens-in route refused the request (vLLM without ``--enable-scale-out``)."""

    def __init__(self, where: str, error: BackendError) -> None:
        super().__init__(f"{where}: {error}")
        self.error = error


class HandshakeError(RuntimeError):
    """The engine's tokenizer does not give the renderer's ids: token-id prompts would be garbage."""


@dataclass(slots=True)
class Generation:
    """One generation: what every try on a replica shares, and what the engine reported."""

    request: GenerationRequest
    renderer: Any
    parser: Any
    headers: dict[str, str]
    calls: int = 0  # tool calls started so far
    finish: str | None = None
    detail: str = ""
    matched_stop: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    sampled: list[int] | None = None
    truncated: bool = False


class Decoding:
    """One try's read of the engine's steps: sampled ids decoded here (or the engine's text),
    parsed into events, the tool-call rules of ``tool_choice`` applied as they come."""

    def __init__(self, outcome: Generation) -> None:
        self.outcome = outcome
        self.decoder = IncrementalDecoder(outcome.renderer.encoding)
        self.mode: str | None = None  # "ids": decode sampled ids here; "text": the engine's text
        #: Whether anything came out yet (a failure after it cannot move to another replica).
        self.streamed = False

    def feed(self, steps: Sequence[Step]) -> list[BackendEvent]:
        """The events of steps that arrived together (decoded and parsed as one). A call the
        request does not allow (``tool_choice: none``, a second one without
        ``parallel_tool_calls``) sets ``outcome.truncated``: the engine is to be stopped there."""
        outcome = self.outcome
        ids: list[int] = []
        texts: list[str] = []
        for step in steps:
            for name in ("prompt_tokens", "cached_tokens", "output_tokens"):
                if getattr(step, name) is not None:
                    setattr(outcome, name, getattr(step, name))
            if self.mode is None and (step.ids is not None or step.text is not None):
                self.mode = "ids" if step.ids is not None else "text"
                if self.mode == "text":
                    outcome.sampled = None  # the engine does not report ids: render the output
            if self.mode == "ids" and step.ids:
                ids.extend(step.ids)
            elif self.mode == "text" and step.text:
                texts.append(step.text)
            if step.finish:
                outcome.finish, outcome.detail = step.finish, step.finish_detail
            if step.matched_stop is not None:
                outcome.matched_stop = step.matched_stop
        text = "".join(texts)
        if ids:
            assert outcome.sampled is not None
            outcome.sampled.extend(ids)
            text = self.decoder.feed(ids)
        self.streamed = self.streamed or bool(ids or texts)
        events: list[BackendEvent] = []
        for event in outcome.parser.feed(text):
            if isinstance(event, ToolCallStart):
                outcome.calls += 1
                request = outcome.request
                if request.tool_choice == "none" or (outcome.calls > 1 and not request.parallel_tool_calls):
                    outcome.truncated = True  # no call, or one call only: stop the engine here
                    break
            self.streamed = True
            events.append(event)
        return events

    def close(self) -> list[BackendEvent]:
        """What the decoder and the parser still held when the engine's stream ended."""
        return [*self.outcome.parser.feed(self.decoder.close()), *self.outcome.parser.close()]


class EngineBackend:
    """A :class:`responses_cache.Backend` for vLLM and SGLang (``engine``)."""

    accepts_media = False  # the prompt is rendered to token ids on this side

    def __init__(
        self,
        base_urls: str | Sequence[str],
        *,
        model: str,
        engine: str = "vllm",
        endpoint: str = "auto",
        served_models: Sequence[str] = (),
        api_key: str | None = None,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        context_window: int | None = None,
        template: str | None = None,
        handshake: bool = True,
        tenant_salt: bool = True,
        salt_key: str | None = None,
        routing_headers: bool = True,
        data_parallel_size: int = 1,
        cooldown: float = 10.0,
        extra_body: Mapping[str, Any] | None = None,
        return_token_ids: bool = True,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if engine not in PREFERENCE:
            raise ValueError(f"engine must be one of {', '.join(PREFERENCE)}, not {engine!r}")
        if endpoint not in ("auto", "generate", "completions"):
            raise ValueError(f"endpoint must be 'auto', 'generate' or 'completions', not {endpoint!r}")
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        self.replicas = Replicas(urls, cooldown=cooldown)
        self.model = model
        self.engine = engine
        self.endpoint = endpoint
        self._models = list(served_models) or [model]
        self.context_window = context_window
        #: The renderer's template name (``harmony``, ``chatml``…): the tokenizer handshake runs
        #: at start. Without it, it runs before the first generation of each renderer.
        self.template = template
        self.handshake = handshake
        #: Salt the engine's prefix cache per tenant when the request carries no salt of its own.
        self.tenant_salt = tenant_salt
        key = salt_key or os.environ.get("RESPONSES_CACHE_SALT_KEY")
        self._salt_key = key.encode() if key else os.urandom(32)
        self.routing_headers = routing_headers
        self.data_parallel_size = max(1, data_parallel_size)
        self.extra_body = dict(extra_body or {})
        #: Ask ``/v1/completions`` for the sampled ids (vLLM ``return_token_ids``).
        self.return_token_ids = return_token_ids
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or engine_client(
            timeout=timeout, connect_timeout=connect_timeout, headers=headers, transport=transport
        )
        self.dialect: Dialect | None = None
        self._verified: set[str] = set()
        self._lock = asyncio.Lock()

    def models(self) -> Sequence[str]:
        return self._models

    # -- start ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Probe the endpoint, learn the context window, check the tokenizer (idempotent).
        Raises :class:`HandshakeError` / :class:`RuntimeError` with the reason to refuse to start."""
        async with self._lock:
            if self.dialect is None:
                self.dialect = await self._detect()
            if self.context_window is None:
                self.context_window = await self._read_context_window()
            if self.template and self.handshake and self.template not in self._verified:
                await self._handshake(get_renderer(self.template))
                self._verified.add(self.template)

    async def _detect(self) -> Dialect:
        names = PREFERENCE[self.engine]
        preferred, fallback = DIALECTS[names[0]], DIALECTS[names[1]]
        if self.endpoint == "completions":
            return fallback
        for url in self.replicas.urls:
            try:
                # An empty body: an enabled route answers 400/422; a missing one 404/405; vLLM
                # 0.32+ answers 403 when the tokens-in route is disabled (no --enable-scale-out).
                response = await self._client.post(url + preferred.path, json={})
            except httpx.TransportError:
                self.replicas.mark_down(url)
                continue
            if response.status_code == 401:
                raise RuntimeError(f"{url} refused the API key ({body_message(response.content)}): set backend_options.api_key")
            if response.status_code not in _NOT_SERVED:
                return preferred
            refusal = f"{url}{preferred.path} answered HTTP {response.status_code}: {body_message(response.content)}"
            if self.endpoint == "generate":
                raise RuntimeError(f"{refusal}. {_ENABLE_HINT[self.engine]}, or set endpoint = \"auto\"")
            self._fall_back(refusal)
            return fallback
        raise RuntimeError(f"no {self.engine} replica is reachable at start ({', '.join(self.replicas.urls)})")

    def _fall_back(self, refusal: str) -> None:
        """Log why the tokens-in route is not used: the completions route costs detokenization."""
        logger.warning(
            "%s; using /v1/completions instead (same token ids, plus text the engine detokenizes). %s.",
            refusal.rstrip(". "), _ENABLE_HINT[self.engine],
        )

    async def _read_context_window(self) -> int:
        for url in self.replicas.ranked(""):
            try:
                response = await self._client.get(url + "/v1/models")
            except httpx.TransportError:
                continue
            if response.status_code != 200:
                continue
            for card in response.json().get("data") or ():
                if card.get("id") == self.model and isinstance(card.get("max_model_len"), int):
                    return int(card["max_model_len"])
            # Both engines' /tokenize answers carry max_model_len too.
            for path in ("/tokenize", "/v1/tokenize"):
                try:
                    answer = await self._client.post(url + path, json={"model": self.model, "prompt": "x"})
                except httpx.TransportError:
                    break
                limit = answer.json().get("max_model_len") if answer.status_code == 200 else None
                if isinstance(limit, int) and 0 < limit < 100_000_000:
                    return limit
        raise RuntimeError(
            f"could not read the context window of {self.model!r} from /v1/models; "
            "set backend_options.context_window"
        )

    async def _handshake(self, renderer: Any) -> None:
        """Refuse a server whose tokenizer gives other ids than the renderer for text with the
        template's special tokens: a token-id prompt in the wrong vocabulary is silent garbage."""
        probe = renderer.decode(list(renderer.stop_tokens)) + _PROBE_TEXT + renderer.decode(list(renderer.generation_prompt))
        expected = list(renderer.encode_with_specials(probe))
        checked = 0
        for url in self.replicas.urls:
            got = await self._tokenize(url, probe)
            if got is None:
                continue
            checked += 1
            if got != expected:
                at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                          min(len(got), len(expected)))
                raise HandshakeError(
                    f"the engine at {url} ({self.model}) tokenizes differently from the renderer "
                    f"{renderer.name!r}: at token {at} the engine gives {got[at:at + 4]}, the renderer "
                    f"{expected[at:at + 4]}. Token-id prompts would be garbage: serve a model with this "
                    "vocabulary or configure the renderer matching the model."
                )
        if checked == 0:
            raise HandshakeError(
                f"could not check the tokenizer of {self.model!r}: no replica answered /tokenize "
                "(set handshake = false only if you are sure the vocabularies match)"
            )
        self._verified.add(renderer.name)

    async def _tokenize(self, url: str, text: str) -> list[int] | None:
        for path in ("/tokenize", "/v1/tokenize"):
            try:
                response = await self._client.post(
                    url + path, json={"model": self.model, "prompt": text, "add_special_tokens": False}
                )
            except httpx.TransportError:
                return None
            if response.status_code == 200:
                tokens = response.json().get("tokens")
                return [int(t) for t in tokens] if isinstance(tokens, list) else None
        return None

    async def _ready(self, renderer: Any) -> Dialect:
        ready = self.dialect is not None and self.context_window is not None
        if ready and (not self.handshake or renderer.name in self._verified):
            assert self.dialect is not None
            return self.dialect
        try:
            await self.start()
            if self.handshake and renderer.name not in self._verified:
                async with self._lock:
                    if renderer.name not in self._verified:
                        await self._handshake(renderer)
        except (RuntimeError, httpx.HTTPError) as exc:
            raise BackendError(f"the {self.engine} backend is not ready: {exc}", "server_error") from exc
        assert self.dialect is not None
        return self.dialect

    # -- one generation ------------------------------------------------------------------------

    def cache_salt(self, request: GenerationRequest) -> str | None:
        """The request's own salt, else one derived from the tenant (unguessable without the key)."""
        if request.cache_salt is not None:
            return request.cache_salt
        if not self.tenant_salt or not request.tenant:
            return None
        digest = hashlib.blake2b(request.tenant.encode(), key=self._salt_key[:64], digest_size=32).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def routing(self, request: GenerationRequest) -> dict[str, str]:
        """Headers that pin the conversation inside the engine's own routing (SGLang's gateway,
        KV-aware routers, data-parallel ranks). The key is a digest: tenant names stay here."""
        headers = {"X-Request-Id": request.response_id, **request.trace_context}
        if not self.routing_headers:
            return headers
        key = hashlib.blake2b(request.affinity_key.encode(), digest_size=16).hexdigest()
        headers["X-SMG-Routing-Key"] = key
        headers["X-Session-ID"] = key
        if self.data_parallel_size > 1:
            headers["X-data-parallel-rank"] = str(data_parallel_rank(key, self.data_parallel_size))
        return headers

    def prefill(self, request: GenerationRequest, renderer: Renderer) -> str:
        """Text appended after the generation prompt to honour ``tool_choice``: a named function
        or ``required`` start the call in the prompt. (``none`` needs no prefill: the stream is
        ended at the first call the model starts, see :meth:`_attempt`.)"""
        choice = request.tool_choice
        if choice in ("auto", "none", None):
            return ""
        name: str | None = None
        if isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
            name = str(choice["name"])
        elif choice != "required":
            raise BackendError(
                f"tool_choice {json.dumps(choice)} is not supported by the {self.engine} backend "
                "(supported: 'auto', 'none', 'required', or a named function)",
                "unsupported_value",
            )
        return renderer.tool_call_prefix(name)

    def _params(self, request: GenerationRequest, prompt: Sequence[int]) -> tuple[Params, list[int], str]:
        assert request.prompt is not None
        renderer = request.prompt.renderer
        prefill_text = self.prefill(request, renderer)
        prefill = list(renderer.encode_with_specials(prefill_text)) if prefill_text else []
        ids = prompt.tolist() if isinstance(prompt, array) else list(prompt)  # the one list the body sends
        ids.extend(prefill)
        max_tokens = request.max_output_tokens
        if self.context_window is not None:
            left = self.context_window - len(ids)
            if left <= 0:
                raise BackendError(
                    f"The prompt ({len(ids)} tokens) does not fit the model's context window "
                    f"({self.context_window} tokens).",
                    "context_length_exceeded",
                )
            max_tokens = min(max_tokens or left, left)
        params = Params(
            model=self.model,
            token_ids=ids,
            max_tokens=max_tokens,
            stop_token_ids=list(renderer.sampling_stop_tokens),
            request_id=request.response_id,
            temperature=request.temperature,
            top_p=request.top_p,
            cache_salt=self.cache_salt(request),
            priority=request.priority,
            return_token_ids=self.return_token_ids,
            extra=self.extra_body,
        )
        return params, prefill, prefill_text

    async def open_stream(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        """Send the request and wait until the engine accepts it (its 200 and headers come before
        prefill): a refusal until then — the engine's 4xx, a prompt over its window, no replica
        reachable — is a plain error with its HTTP status, raised before the response exists."""
        return await until_accepted(self._stream(request))

    def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        return without_marker(self._stream(request))

    async def _stream(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent | Accepted, None]:
        """The generation's events, with an :data:`~responses_cache.engines.ACCEPTED` marker where the engine accepted it."""
        if request.prompt is None:
            raise BackendError("this backend needs a route with a renderer (token-id prompts)", "server_error")
        renderer = request.prompt.renderer
        dialect = await self._ready(renderer)
        params, prefill, prefill_text = self._params(request, request.prompt.tokens())
        headers = self.routing(request)
        customs = frozenset(tool.name for tool in request.tools.customs())
        outcome = Generation(request, renderer, renderer.output_parser(customs), headers, sampled=list(prefill))
        for event in outcome.parser.feed(prefill_text):
            outcome.calls += isinstance(event, ToolCallStart)
            yield event
        # aclosing: closing this generator closes the ones it iterates at once (the engine's HTTP
        # stream with them), not whenever the garbage collector finalizes them.
        try:
            async with contextlib.aclosing(self._generation(dialect, params, outcome)) as steps:
                async for step in steps:
                    yield step
        except _RouteDisabled as exc:
            if self.endpoint != "auto":
                raise exc.error from None
            # The engine was restarted without the tokens-in route: nothing was streamed yet.
            self._fall_back(str(exc))
            self.dialect = dialect = DIALECTS[PREFERENCE[self.engine][1]]
            async with contextlib.aclosing(self._generation(dialect, params, outcome)) as steps:
                async for step in steps:
                    yield step
        if outcome.truncated:
            yield Finish(reason="stop", usage=self._usage(outcome, prefill), token_ids=None)
            return
        reason = _FINISH.get(outcome.finish or "")
        if reason is None:
            if outcome.finish is None:
                raise BackendError("the engine's stream ended without a finish reason", "server_error")
            raise finish_error(outcome.finish, outcome.detail)
        sampled = outcome.sampled
        if reason == "stop" and sampled is not None and outcome.matched_stop is not None and (
            not sampled or sampled[-1] != outcome.matched_stop
        ):
            sampled.append(outcome.matched_stop)  # an engine that trims the stop id
        yield Finish(reason=reason, usage=self._usage(outcome, prefill), token_ids=sampled or None)  # type: ignore[arg-type]

    def _generation(
        self, dialect: Dialect, params: Params, outcome: Generation
    ) -> AsyncGenerator[BackendEvent | Accepted, None]:
        """The engine's events for ``params`` (an :data:`~responses_cache.engines.ACCEPTED` marker
        first): the request in ``dialect`` on the replicas. ``outcome`` gathers what the engine
        reports; :class:`Decoding` turns its steps into events."""
        return self._on_replicas(dialect, dialect.body(params), outcome)

    async def _on_replicas(
        self, dialect: Dialect, body: dict[str, Any], outcome: Generation
    ) -> AsyncGenerator[BackendEvent | Accepted, None]:
        """The request on the conversation's replica, failing over to the next ones while none
        has streamed anything."""
        unavailable: list[str] = []
        for url in self.replicas.ranked(outcome.request.affinity_key):
            try:
                async with contextlib.aclosing(self._attempt(url, dialect, body, outcome)) as events:
                    async for event in events:
                        yield event
            except EngineUnavailable as exc:
                self.replicas.mark_down(url)
                unavailable.append(f"{url}: {exc}")
                continue
            return
        raise BackendError(
            f"no {self.engine} replica could take the request ({'; '.join(unavailable)})", "server_error"
        )

    async def _attempt(
        self, url: str, dialect: Dialect, body: dict[str, Any], outcome: Generation
    ) -> AsyncGenerator[BackendEvent | Accepted, None]:
        """One try on one replica. Raises :class:`EngineUnavailable` only before any output."""
        decoding = Decoding(outcome)
        try:
            content, headers = json_body(body), {**outcome.headers, **JSON_CONTENT_TYPE}
            async with self._client.stream("POST", url + dialect.path, content=content, headers=headers) as response:
                if response.status_code != 200:
                    error = http_error(response.status_code, await response.aread(), response.headers)
                    if response.status_code in RETRYABLE_STATUS:
                        raise EngineUnavailable(error)
                    if response.status_code == 403 and dialect.path == DIALECTS[PREFERENCE[self.engine][0]].path:
                        raise _RouteDisabled(f"{url}{dialect.path} refused the request", error)
                    raise error
                self.replicas.mark_up(url)
                yield ACCEPTED
                reader = dialect.reader()
                # What arrived together is decoded, parsed and yielded once (see ``batched``).
                async with contextlib.aclosing(batched(EventSource(response).aiter_sse())) as batches:
                    async for batch in batches:
                        steps: list[Step] = []
                        done = False
                        failure: BackendError | None = None  # raised once what came before it is out
                        for sse in batch:
                            if sse.data == "[DONE]":
                                done = True
                                break
                            try:
                                steps.append(reader.read(json_chunk(sse.data, "the engine")))
                            except BackendError as exc:
                                failure = exc
                                break
                        for event in decoding.feed(steps):
                            yield event
                        if outcome.truncated:
                            return
                        if failure is not None:
                            raise failure
                        if done:
                            break
        except httpx.TransportError as exc:
            if decoding.streamed:
                raise BackendError(f"the connection to the engine broke mid-stream: {exc}", "server_error") from exc
            raise EngineUnavailable(BackendError(str(exc) or type(exc).__name__, "server_error")) from exc
        for event in decoding.close():
            yield event

    @staticmethod
    def _usage(outcome: Generation, prefill: list[int]) -> EngineUsage:
        output = outcome.output_tokens + len(prefill) if outcome.output_tokens is not None else None
        return EngineUsage(prompt_tokens=outcome.prompt_tokens, cached_tokens=outcome.cached_tokens, output_tokens=output)

    async def aclose(self) -> None:
        await self._client.aclose()


#: The name used before SGLang's tokens-in route and fail-over were added.
CompletionsBackend = EngineBackend
