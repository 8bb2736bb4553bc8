"""``CompletionsBackend``: token-id prompts to an OpenAI-compatible ``/v1/completions``.

vLLM and SGLang accept ``prompt`` as a list of token ids. The server has already rendered the
conversation (and appended only the new turn's tokens), so the engine receives exactly the prompt
the connection cache holds, and its prefix cache sees an exact prefix. With several ``base_urls``
(replicas) a conversation is pinned to one of them by its ``affinity_key``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import httpx
from httpx_sse import EventSource

from responses_cache import (
    BackendError,
    BackendEvent,
    EngineUsage,
    Finish,
    GenerationRequest,
)

from .parsing import parser_for

_FINISH = {"length": "length", "content_filter": "content_filter"}


class CompletionsBackend:
    """A :class:`responses_cache.Backend` for vLLM / SGLang's ``/v1/completions``."""

    accepts_media = False  # the prompt is rendered to token ids on this side

    def __init__(
        self,
        base_urls: str | Sequence[str],
        *,
        model: str,
        served_models: Sequence[str] = (),
        api_key: str | None = None,
        max_tokens: int = 4096,
        timeout: float = 600.0,
        extra_body: Mapping[str, Any] | None = None,
        return_token_ids: bool = True,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not self.base_urls:
            raise ValueError("CompletionsBackend needs at least one base URL")
        self.model = model
        self._models = list(served_models) or [model]
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})
        #: Ask for the sampled ids (vLLM's ``return_token_ids``); turn off for engines without it.
        self.return_token_ids = return_token_ids
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.AsyncClient(timeout=timeout, headers=headers)

    def models(self) -> Sequence[str]:
        return self._models

    def replica(self, affinity_key: str) -> str:
        """The base URL a conversation is pinned to."""
        if len(self.base_urls) == 1:
            return self.base_urls[0]
        digest = hashlib.blake2b(affinity_key.encode(), digest_size=8).digest()
        return self.base_urls[int.from_bytes(digest, "big") % len(self.base_urls)]

    def body(self, request: GenerationRequest) -> dict[str, Any]:
        if request.prompt is None:
            raise BackendError("this backend needs a route with a renderer (token-id prompts)", "server_error")
        renderer = request.prompt.renderer
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(request.prompt.tokens()),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_output_tokens or self.max_tokens,
            "skip_special_tokens": False,  # the output parser follows the template's markers
            "stop_token_ids": _stop_ids(renderer.name, renderer),
        }
        if self.return_token_ids:
            body["return_token_ids"] = True  # the sampled ids, kept as the assistant turn
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.top_p is not None:
            body["top_p"] = request.top_p
        body.update(self.extra_body)
        return body

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        body = self.body(request)
        parser = parser_for(request.prompt.renderer.name if request.prompt else "")
        url = self.replica(request.affinity_key).rstrip("/") + "/v1/completions"
        sampled: list[int] | None = []
        usage: dict[str, Any] = {}
        reason = "stop"
        try:
            async with self._client.stream("POST", url, json=body) as response:
                if response.status_code != 200:
                    raise _error_of(response.status_code, await response.aread())
                async for sse in EventSource(response).aiter_sse():
                    if sse.data == "[DONE]":
                        break
                    chunk = json.loads(sse.data)
                    if chunk.get("error"):
                        raise BackendError(str(chunk["error"].get("message", chunk["error"])), "server_error")
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or ():
                        ids = choice.get("token_ids")
                        if sampled is not None:
                            if ids is None:
                                sampled = None  # the engine does not report ids: render the output
                            else:
                                sampled.extend(ids)
                        for event in parser.feed(choice.get("text") or ""):
                            yield event
                        reason = _FINISH.get(choice.get("finish_reason") or "", reason)
        except httpx.HTTPError as exc:
            raise BackendError(f"the engine is unreachable: {exc}", "server_error") from exc
        for event in parser.close():
            yield event
        yield Finish(
            reason=reason,  # type: ignore[arg-type]
            usage=EngineUsage(
                prompt_tokens=usage.get("prompt_tokens"),
                cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                output_tokens=usage.get("completion_tokens"),
            ),
            token_ids=sampled or None,
        )

    async def aclose(self) -> None:
        await self._client.aclose()


def _stop_ids(template: str, renderer: Any) -> list[int]:
    encoding = renderer.encoding
    names = ("<|return|>", "<|call|>") if template.startswith("harmony") else ("<|im_end|>",)
    return [encoding.encode_single_token(name) for name in names]


def _error_of(status: int, body: bytes) -> BackendError:
    try:
        payload = json.loads(body)
        error = payload.get("error", payload) if isinstance(payload, dict) else payload
        message = error.get("message") if isinstance(error, dict) else str(error)
    except ValueError:
        message = body.decode(errors="replace")[:500]
    return BackendError(f"the engine answered HTTP {status}: {message}", "server_error")
