"""responses-cache backend for vLLM and SGLang (OpenAI-compatible ``/v1/completions`` with
token-id prompts). Registered as ``vllm`` and ``sglang``::

    responses-cache serve --backend vllm --config serve.toml   # backend_options: base_urls, model
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .backend import CompletionsBackend
from .parsing import ChatMLParser, HarmonyParser, parser_for


def make_backend(
    *,
    base_urls: str | Sequence[str] | None = None,
    model: str | None = None,
    **options: Any,
) -> CompletionsBackend:
    """Entry-point factory. ``base_urls`` falls back to ``VLLM_BASE_URL`` (comma-separated),
    ``model`` to ``VLLM_MODEL``, the key to ``VLLM_API_KEY``."""
    urls = base_urls or [u for u in os.environ.get("VLLM_BASE_URL", "").split(",") if u]
    name = model or os.environ.get("VLLM_MODEL")
    if not urls or not name:
        raise ValueError("the vllm backend needs base_urls and model (backend_options, or VLLM_BASE_URL / VLLM_MODEL)")
    options.setdefault("api_key", os.environ.get("VLLM_API_KEY"))
    return CompletionsBackend(urls, model=name, **options)


__all__ = ["ChatMLParser", "CompletionsBackend", "HarmonyParser", "make_backend", "parser_for"]
