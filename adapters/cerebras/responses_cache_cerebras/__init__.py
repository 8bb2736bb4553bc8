"""responses-cache backend for the Cerebras Inference API. Registered as ``cerebras``::

    responses-cache serve --backend cerebras --config serve.toml   # backend_options: model, modes

The key comes from ``api_key`` or ``CEREBRAS_API_KEY``, the address from ``base_url`` or
``CEREBRAS_BASE_URL`` (both read by the SDK).
"""

from __future__ import annotations

import os
from typing import Any

from .backend import CerebrasBackend
from .messages import to_messages, to_tools


def make_backend(*, model: str | None = None, **options: Any) -> CerebrasBackend:
    """Entry-point factory; ``model`` falls back to ``CEREBRAS_MODEL`` (default ``gpt-oss-120b``)."""
    return CerebrasBackend(model=model or os.environ.get("CEREBRAS_MODEL", "gpt-oss-120b"), **options)


__all__ = ["CerebrasBackend", "make_backend", "to_messages", "to_tools"]
