"""responses-cache backend for vLLM and SGLang (token-id prompts). Registered as ``vllm`` and
``sglang``::

    responses-cache serve --backend vllm --config serve.toml   # backend_options: base_urls, model

See :class:`EngineBackend` for the options; :mod:`.middleware` runs inside ``vllm serve``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .backend import CompletionsBackend, EngineBackend, HandshakeError
from .placement import Replicas, rendezvous


def _make(engine: str, prefix: str, base_urls: str | Sequence[str] | None, model: str | None, options: dict[str, Any]) -> EngineBackend:
    urls = base_urls or [u for u in os.environ.get(f"{prefix}_BASE_URL", "").split(",") if u]
    name = model or os.environ.get(f"{prefix}_MODEL")
    if not urls or not name:
        raise ValueError(
            f"the {engine} backend needs base_urls and model (backend_options, or {prefix}_BASE_URL / {prefix}_MODEL)"
        )
    options.setdefault("api_key", os.environ.get(f"{prefix}_API_KEY"))
    return EngineBackend(urls, model=name, engine=engine, **options)


def make_backend(*, base_urls: str | Sequence[str] | None = None, model: str | None = None, **options: Any) -> EngineBackend:
    """Entry point ``vllm``. ``base_urls`` falls back to ``VLLM_BASE_URL`` (comma-separated),
    ``model`` to ``VLLM_MODEL``, the key to ``VLLM_API_KEY``."""
    return _make("vllm", "VLLM", base_urls, model, options)


def make_sglang_backend(
    *, base_urls: str | Sequence[str] | None = None, model: str | None = None, **options: Any
) -> EngineBackend:
    """Entry point ``sglang``: as :func:`make_backend` with ``SGLANG_BASE_URL`` / ``SGLANG_MODEL`` /
    ``SGLANG_API_KEY``."""
    return _make("sglang", "SGLANG", base_urls, model, options)


__all__ = [
    "CompletionsBackend",
    "EngineBackend",
    "HandshakeError",
    "Replicas",
    "make_backend",
    "make_sglang_backend",
    "rendezvous",
]
