"""The engines' token-id endpoints: what each takes and how its stream reads.

=====================  ==========================  =========================================
dialect                path                        stream
=====================  ==========================  =========================================
``vllm-generate``      ``/inference/v1/generate``  ``choices[].token_ids`` (no text: decoded
                                                   here), usage in a final ``choices: []``
``vllm-completions``   ``/v1/completions``         ``choices[].text`` + ``token_ids``
                                                   (``return_token_ids``), ``stop_reason``
``sglang-generate``    ``/generate``               cumulative ``text``/``output_ids`` (or
                                                   incremental), ``meta_info``
``sglang-completions`` ``/v1/completions``         ``choices[].text`` (+ ``token_ids``),
                                                   ``matched_stop``
=====================  ==========================  =========================================

Field names are the engines' documented ones (vLLM 0.33.0, SGLang 0.5.23): the engines ignore
unknown fields silently, so a misspelling here would fail without a word.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from responses_cache.engines import stream_error


@dataclass(frozen=True, slots=True)
class Params:
    model: str
    #: The prompt, one list made once per request (the bodies send it as is: no copy per dialect).
    token_ids: list[int]
    max_tokens: int | None
    stop_token_ids: Sequence[int]
    request_id: str
    temperature: float | None = None
    top_p: float | None = None
    cache_salt: str | None = None
    #: The request's scheduling priority (lower first); sent only when set, since an engine not
    #: started with priority scheduling refuses a non-zero one.
    priority: int | None = None
    return_token_ids: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Step:
    """What one streamed frame adds."""

    ids: list[int] | None = None  # new sampled ids (None: the engine does not report them)
    text: str | None = None  # new text (None: decode ``ids`` locally)
    finish: str | None = None
    finish_detail: str = ""
    matched_stop: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None


class Reader(Protocol):
    def read(self, payload: Mapping[str, Any]) -> Step: ...


class Dialect(Protocol):
    name: str
    path: str

    def body(self, p: Params) -> dict[str, Any]: ...

    def reader(self) -> Reader: ...


def _scheduled(p: Params, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the request's prefix-cache salt and priority (the same fields in vLLM and
    SGLang), then the caller's extra fields over everything."""
    if p.cache_salt is not None:
        body["cache_salt"] = p.cache_salt
    if p.priority is not None:
        body["priority"] = p.priority
    body.update(p.extra)
    return body


def _sampling(p: Params, body: dict[str, Any]) -> None:
    if p.temperature is not None:
        body["temperature"] = p.temperature
    if p.top_p is not None:
        body["top_p"] = p.top_p


def _usage(step: Step, usage: Any) -> None:
    if isinstance(usage, Mapping):
        step.prompt_tokens = usage.get("prompt_tokens")
        step.output_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        if isinstance(details, Mapping):
            step.cached_tokens = details.get("cached_tokens")


def _check_error(payload: Mapping[str, Any]) -> None:
    if payload.get("error") or payload.get("object") == "error":
        raise stream_error(payload)


class _ChoicesReader:
    """OpenAI-style chunks: ``choices[0]`` plus an optional ``usage``."""

    def __init__(self, stop_field: str) -> None:
        self._stop_field = stop_field

    def read(self, payload: Mapping[str, Any]) -> Step:
        _check_error(payload)
        step = Step()
        _usage(step, payload.get("usage"))
        for choice in payload.get("choices") or ():
            ids = choice.get("token_ids")
            step.ids = list(ids) if ids is not None else None
            step.text = choice.get("text")
            step.finish = choice.get("finish_reason") or step.finish
            matched = choice.get(self._stop_field)
            if isinstance(matched, int) and not isinstance(matched, bool):
                step.matched_stop = matched
        return step


class VllmGenerate:
    """vLLM ``POST /inference/v1/generate``: tokens in, tokens out."""

    name = "vllm-generate"
    path = "/inference/v1/generate"

    def body(self, p: Params) -> dict[str, Any]:
        sampling: dict[str, Any] = {
            "stop_token_ids": list(p.stop_token_ids),
            "skip_special_tokens": False,
            "detokenize": False,  # decoded here with the renderer's encoding
        }
        if p.max_tokens is not None:
            sampling["max_tokens"] = p.max_tokens
        _sampling(p, sampling)
        body: dict[str, Any] = {
            "request_id": p.request_id,
            "model": p.model,
            "token_ids": p.token_ids,
            "sampling_params": sampling,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        return _scheduled(p, body)

    def reader(self) -> Reader:
        return _GenerateReader()


class _GenerateReader:
    def read(self, payload: Mapping[str, Any]) -> Step:
        _check_error(payload)
        step = Step()
        _usage(step, payload.get("usage"))
        for choice in payload.get("choices") or ():
            step.ids = list(choice.get("token_ids") or [])
            step.finish = choice.get("finish_reason") or step.finish
        return step


class VllmCompletions:
    """vLLM ``POST /v1/completions`` with a token-id prompt and ``return_token_ids``."""

    name = "vllm-completions"
    path = "/v1/completions"

    def body(self, p: Params) -> dict[str, Any]:
        body: dict[str, Any] = {
            "request_id": p.request_id,
            "model": p.model,
            "prompt": p.token_ids,
            "stream": True,
            "stream_options": {"include_usage": True},
            "skip_special_tokens": False,  # the output parser follows the template's markers
            "stop_token_ids": list(p.stop_token_ids),
        }
        if p.max_tokens is not None:
            body["max_tokens"] = p.max_tokens
        if p.return_token_ids:
            body["return_token_ids"] = True  # the sampled ids, kept as the assistant turn
        _sampling(p, body)
        return _scheduled(p, body)

    def reader(self) -> Reader:
        return _ChoicesReader("stop_reason")


class SglangGenerate:
    """SGLang ``POST /generate`` with ``input_ids``; frames are cumulative by default."""

    name = "sglang-generate"
    path = "/generate"

    def body(self, p: Params) -> dict[str, Any]:
        sampling: dict[str, Any] = {
            "stop_token_ids": list(p.stop_token_ids),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if p.max_tokens is not None:
            sampling["max_new_tokens"] = p.max_tokens
        _sampling(p, sampling)
        body: dict[str, Any] = {
            "rid": p.request_id,
            "input_ids": p.token_ids,
            "sampling_params": sampling,
            "stream": True,
        }
        return _scheduled(p, body)

    def reader(self) -> Reader:
        return _SglangFrames()


class _SglangFrames:
    """Turns SGLang frames into increments, whether the server streams cumulative frames
    (the default) or increments (``--incremental-streaming-output``): a frame whose
    ``output_ids`` has ``meta_info.completion_tokens`` ids is cumulative."""

    def __init__(self) -> None:
        self._ids = 0
        self._text = 0

    def read(self, payload: Mapping[str, Any]) -> Step:
        _check_error(payload)
        meta = payload.get("meta_info") or {}
        ids = list(payload.get("output_ids") or [])
        text = payload.get("text") or ""
        completion = meta.get("completion_tokens")
        if completion is not None and len(ids) == completion and len(ids) >= self._ids:
            new_ids, new_text = ids[self._ids :], text[self._text :]
            self._ids, self._text = len(ids), len(text)
        else:
            new_ids, new_text = ids, text
            self._ids, self._text = self._ids + len(ids), self._text + len(text)
        step = Step(ids=new_ids, text=new_text)
        finish = meta.get("finish_reason")
        if isinstance(finish, Mapping):
            step.finish = str(finish.get("type"))
            matched = finish.get("matched")
            if isinstance(matched, int) and not isinstance(matched, bool):
                step.matched_stop = matched
            step.finish_detail = str(finish.get("message") or "")
        elif isinstance(finish, str):
            step.finish = finish
        step.prompt_tokens = meta.get("prompt_tokens")
        step.output_tokens = completion
        step.cached_tokens = meta.get("cached_tokens")
        return step


class SglangCompletions(VllmCompletions):
    """SGLang ``POST /v1/completions``: a list prompt becomes ``input_ids``; ``matched_stop``."""

    name = "sglang-completions"

    def body(self, p: Params) -> dict[str, Any]:
        body = super().body(p)
        body.pop("request_id")
        body["rid"] = p.request_id
        body["no_stop_trim"] = True
        return body

    def reader(self) -> Reader:
        return _ChoicesReader("matched_stop")


DIALECTS: dict[str, Dialect] = {
    d.name: d for d in (VllmGenerate(), VllmCompletions(), SglangGenerate(), SglangCompletions())
}
#: Per engine, the preferred endpoint first (``endpoint = "auto"`` takes the first one the
#: engine serves).
PREFERENCE = {"vllm": ("vllm-generate", "vllm-completions"), "sglang": ("sglang-generate", "sglang-completions")}
