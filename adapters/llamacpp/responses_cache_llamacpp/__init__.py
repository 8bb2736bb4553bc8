"""responses-cache backend for llama.cpp's ``llama-server``. Registered as ``llamacpp``::

    responses-cache serve --backend llamacpp --config serve.toml   # backend_options: base_urls

See :class:`LlamaCppBackend` for the options, ``docs/llamacpp.md`` for a laptop set-up.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .backend import HandshakeError, LlamaCppBackend
from .slots import Replicas, SlotTable


def make_backend(*, base_urls: str | Sequence[str] | None = None, model: str | None = None, **options: Any) -> LlamaCppBackend:
    """Entry point ``llamacpp``. ``base_urls`` falls back to ``LLAMACPP_BASE_URL``
    (comma-separated, default ``http://127.0.0.1:8080``), ``model`` (the name clients use) to
    ``LLAMACPP_MODEL`` (default ``llama.cpp``), the key to ``LLAMACPP_API_KEY``."""
    urls = base_urls or [u for u in os.environ.get("LLAMACPP_BASE_URL", "http://127.0.0.1:8080").split(",") if u]
    options.setdefault("api_key", os.environ.get("LLAMACPP_API_KEY"))
    return LlamaCppBackend(urls, model=model or os.environ.get("LLAMACPP_MODEL", "llama.cpp"), **options)


__all__ = ["HandshakeError", "LlamaCppBackend", "Replicas", "SlotTable", "make_backend"]
