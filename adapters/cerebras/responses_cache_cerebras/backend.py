"""``CerebrasBackend``: the Cerebras Inference API through the official SDK (``cerebras_cloud_sdk``).

Two paths, chosen per model (``modes``):

* ``tokens`` (default): the rendered prompt as token ids to ``/v1/completions``
  (``return_raw_tokens`` asks for the sampled ids), the text parsed back with the template's
  parser (harmony for gpt-oss). The prompt is exactly the connection cache's token log, so the
  engine's automatic prefix cache (128-token blocks) sees an exact prefix. Cerebras takes no
  ``stop_token_ids``; the template's stop markers go as ``stop`` strings (at most 4).
* ``chat``: ``/v1/chat/completions`` with byte-stable messages (:mod:`.messages`), reasoning
  passed back and ``clear_thinking: false``, tools, ``tool_choice`` and ``parallel_tool_calls``
  forwarded as the API defines them.

Rate-limit headers (``x-ratelimit-*``) of every answer go to ``metrics`` (as gauges observed
under ``cerebras_ratelimit_*``) and to :attr:`CerebrasBackend.rate_limits`.

The SDK streams over its aiohttp client (``DefaultAioHttpClient``) unless given one: a token
streamed alone costs about half the CPU that httpx's own transport spends on it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import httpx
from cerebras.cloud.sdk import (
    APIConnectionError,
    APIStatusError,
    AsyncCerebras,
    DefaultAioHttpClient,
)

from responses_cache import (
    BackendError,
    BackendEvent,
    EngineUsage,
    Finish,
    GenerationRequest,
    Metrics,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from responses_cache.engines import (
    IncrementalDecoder,
    batched,
    finish_error,
    http_error,
    merge_deltas,
    stream_error,
)

from .messages import split_name, to_messages, to_tool_choice, to_tools

_FINISH = {"stop": "stop", "tool_calls": "stop", "length": "length", "content_filter": "content_filter"}


class CerebrasBackend:
    """A :class:`responses_cache.Backend` for the Cerebras Inference API."""

    accepts_media = False

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None = None,
        base_url: str | None = None,
        served_models: Sequence[str] = (),
        mode: str = "tokens",
        modes: Mapping[str, str] | None = None,
        context_window: int | None = None,
        max_retries: int = 2,
        timeout: float = 600.0,
        metrics: Metrics | None = None,
        warm_tcp_connection: bool = True,
        client: AsyncCerebras | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        for m in (mode, *(modes or {}).values()):
            if m not in ("tokens", "chat"):
                raise ValueError(f"a Cerebras mode is 'tokens' or 'chat', not {m!r}")
        self.model = model
        self._models = list(served_models) or [model]
        self.mode = mode
        #: Per served model name: ``tokens`` or ``chat``.
        self.modes = dict(modes or {})
        self.context_window = context_window
        self.metrics = metrics
        #: The latest ``x-ratelimit-*`` values (header name without the prefix -> value).
        self.rate_limits: dict[str, float] = {}
        self.client = client or AsyncCerebras(
            api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout,
            warm_tcp_connection=warm_tcp_connection, http_client=http_client or DefaultAioHttpClient(),
        )

    def models(self) -> Sequence[str]:
        return self._models

    def mode_for(self, model: str) -> str:
        return self.modes.get(model, self.mode)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        events = self._chat(request) if self.mode_for(request.model) == "chat" else self._tokens(request)
        try:
            # aclosing: closing this generator closes the SDK stream at once, not at finalization.
            async with contextlib.aclosing(events):
                async for event in events:
                    yield event
        except APIStatusError as exc:
            raise _status_error(exc) from exc
        except APIConnectionError as exc:
            raise BackendError(f"Cerebras is unreachable: {exc}", "server_error") from exc

    # -- token-id completions ------------------------------------------------------------------

    async def _tokens(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        if request.prompt is None:
            raise BackendError("the Cerebras token path needs a route with a renderer (or mode 'chat')", "server_error")
        if request.tool_choice not in ("auto", None):
            raise BackendError(
                f"tool_choice {request.tool_choice!r} is not supported on Cerebras token prompts; "
                "use mode 'chat' for this model",
                "unsupported_value",
            )
        renderer = request.prompt.renderer
        prompt = list(request.prompt.tokens())
        stops = [renderer.decode([token]) for token in renderer.sampling_stop_tokens]
        max_tokens = self._max_tokens(request, len(prompt))
        kwargs: dict[str, Any] = {}
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if request.top_p is not None:
            kwargs["top_p"] = request.top_p
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        raw = await self.client.completions.with_raw_response.create(
            model=self.model, prompt=prompt, stream=True, return_raw_tokens=True, stop=stops,
            extra_headers={"X-Request-Id": request.response_id, **request.trace_context}, **kwargs,
        )
        self._observe(raw.headers)
        stream: Any = await raw.parse()
        customs = frozenset(tool.name for tool in request.tools.customs())
        parser = renderer.output_parser(customs)
        decoder = IncrementalDecoder(renderer.encoding)
        sampled: list[int] | None = []
        reason: str | None = None
        usage: Any = None
        last_kind: type | None = None
        received = 0
        # What arrived together is decoded, parsed and yielded once (see ``batched``).
        async with contextlib.aclosing(_batches(stream)) as batches:
            async for batch, failure in batches:
                pieces: list[str] = []
                for chunk in batch:
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or ():
                        tokens = choice.get("tokens")
                        if tokens is not None and sampled is not None:
                            sampled.extend(tokens)
                            pieces.append(decoder.feed(tokens))
                        else:
                            sampled = None  # no raw tokens: parse the text, render the turn
                            pieces.append(choice.get("text") or "")
                        reason = choice.get("finish_reason") or reason
                text = "".join(pieces)
                received += len(text)
                for event in parser.feed(text):
                    last_kind = type(event)
                    yield event
                if failure is not None:
                    raise failure
        for event in (*parser.feed(decoder.close() if sampled is not None else ""), *parser.close()):
            last_kind = type(event)
            yield event
        if received and last_kind is None:
            # Text came back, but not one marker of the template: the engine stripped them, and
            # the output cannot be told apart (reasoning, answer, calls). Fail instead of guessing.
            raise BackendError(
                f"Cerebras returned {self.model}'s text without the {renderer.name} markers (and without raw "
                "tokens), so it cannot be parsed; use mode 'chat' for this model",
                "server_error",
            )
        mapped = _FINISH.get(reason or "")
        if mapped is None:
            raise BackendError("Cerebras ended the stream without a finish reason", "server_error") if reason is None \
                else finish_error(reason)
        if mapped == "stop" and sampled and sampled[-1] not in renderer.sampling_stop_tokens:
            # A stop string is not part of the output: put the marker back for the token log.
            sampled.append(renderer.end_token(last_kind in (ToolCallStart, ToolCallDelta)))
        yield Finish(reason=mapped, usage=_usage(usage), token_ids=sampled or None)  # type: ignore[arg-type]

    def _max_tokens(self, request: GenerationRequest, prompt_tokens: int) -> int | None:
        if self.context_window is None:
            return request.max_output_tokens
        left = self.context_window - prompt_tokens
        if left <= 0:
            raise BackendError(
                f"The prompt ({prompt_tokens} tokens) does not fit the model's context window ({self.context_window} tokens).",
                "context_length_exceeded",
            )
        return min(request.max_output_tokens or left, left)

    # -- chat completions ----------------------------------------------------------------------

    def chat_body(self, request: GenerationRequest) -> dict[str, Any]:
        """The keyword arguments of the chat call (byte-stable for an unchanged history)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_messages(request.instructions, request.conversation.items()),
            "stream": True,
            "clear_thinking": False,  # keep earlier turns' reasoning: the agent loop resends it
        }
        tools = to_tools(request.tools)
        if tools:
            body["tools"] = tools
            body["tool_choice"] = to_tool_choice(request.tool_choice)
            body["parallel_tool_calls"] = request.parallel_tool_calls
        if request.max_output_tokens is not None:
            body["max_completion_tokens"] = request.max_output_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.top_p is not None:
            body["top_p"] = request.top_p
        effort = (request.reasoning or {}).get("effort")
        if effort in ("low", "medium", "high"):
            body["reasoning_effort"] = effort
        return body

    async def _chat(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        raw = await self.client.chat.completions.with_raw_response.create(
            **self.chat_body(request), extra_headers={"X-Request-Id": request.response_id, **request.trace_context}
        )
        self._observe(raw.headers)
        stream: Any = await raw.parse()
        reason: str | None = None
        usage: Any = None
        async with contextlib.aclosing(_batches(stream)) as batches:
            async for batch, failure in batches:
                events: list[BackendEvent] = []
                for chunk in batch:
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or ():
                        delta = choice.get("delta") or {}
                        if delta.get("reasoning"):
                            events.append(ReasoningDelta(str(delta["reasoning"])))
                        if delta.get("content"):
                            events.append(TextDelta(str(delta["content"])))
                        for call in delta.get("tool_calls") or ():
                            function = call.get("function") or {}
                            if call.get("id") and function.get("name"):
                                namespace, name = split_name(str(function["name"]))
                                events.append(ToolCallStart(name=name, call_id=str(call["id"]), namespace=namespace))
                            if function.get("arguments"):
                                events.append(ToolCallDelta(str(function["arguments"])))
                        reason = choice.get("finish_reason") or reason
                for event in merge_deltas(events):  # what arrived together, one delta per run
                    yield event
                if failure is not None:
                    raise failure
        mapped = _FINISH.get(reason or "")
        if mapped is None:
            raise BackendError("Cerebras ended the stream without a finish reason", "server_error") if reason is None \
                else finish_error(reason)
        yield Finish(reason=mapped, usage=_usage(usage))  # type: ignore[arg-type]

    # -- metrics ---------------------------------------------------------------------------------

    def _observe(self, headers: Mapping[str, str]) -> None:
        for name, value in headers.items():
            if not name.lower().startswith("x-ratelimit-"):
                continue
            try:
                number = float(value)
            except ValueError:
                continue
            key = name.lower()[len("x-ratelimit-") :]
            self.rate_limits[key] = number
            if self.metrics is not None:
                self.metrics.observe("cerebras_ratelimit_" + key.replace("-", "_"), number)

    async def aclose(self) -> None:
        await self.client.close()


def _plain(chunk: Any) -> dict[str, Any]:
    if isinstance(chunk, Mapping):
        return dict(chunk)
    data: dict[str, Any] = chunk.to_dict()
    return data


def _usage(usage: Any) -> EngineUsage | None:
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("prompt_tokens_details") or {}
    return EngineUsage(
        prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=details.get("cached_tokens"),
        output_tokens=usage.get("completion_tokens"),
    )


def _status_error(exc: APIStatusError) -> BackendError:
    body = exc.body if exc.body is not None else {"message": exc.message}
    return http_error(exc.status_code, json.dumps(body).encode(), exc.response.headers)


async def _chunks(stream: Any) -> AsyncGenerator[Any, None]:
    """The SDK stream's chunks, the stream closed however the reading ends."""
    try:
        async for item in stream:
            yield item
    finally:
        await stream.close()


async def _batches(stream: Any) -> AsyncGenerator[tuple[list[dict[str, Any]], BackendError | None], None]:
    """The SDK stream as lists of the chunks that arrived together (:func:`batched`), read as plain
    data (the SDK builds stream chunks without validation, and a chunk may come back as the wrong
    member of its response union). An error chunk ends the stream: its error comes with the list of
    the chunks before it, to be raised once they are out."""
    async with contextlib.aclosing(batched(_chunks(stream))) as batches:
        async for batch in batches:
            chunks: list[dict[str, Any]] = []
            for item in batch:
                chunk = _plain(item)
                if chunk.get("error"):
                    yield chunks, stream_error(chunk)
                    return
                chunks.append(chunk)
            yield chunks, None
