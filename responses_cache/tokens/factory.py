"""``get_renderer``: a renderer by template name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import BaseRenderer
from .chatml import ChatMLRenderer
from .harmony import HarmonyRenderer

#: Template name -> (renderer class, default encoding).
TEMPLATES: dict[str, tuple[Callable[..., BaseRenderer], str]] = {
    "harmony": (HarmonyRenderer, "o200k_harmony"),
    "chatml": (ChatMLRenderer, "cl100k_base"),
}


def get_renderer(template: str = "harmony", *, encoding: str | None = None, **options: Any) -> BaseRenderer:
    """A new renderer: ``get_renderer("harmony")``, ``get_renderer("chatml", encoding="o200k_base")``.

    ``options`` go to the renderer class (e.g. ``reasoning_effort="high"``, ``vocab_dir=...``).
    Vocabularies are loaded once per process, so creating renderers is cheap.
    """
    entry = TEMPLATES.get(template)
    if entry is None:
        raise ValueError(f"unknown template {template!r}; expected one of {', '.join(TEMPLATES)}")
    cls, default_encoding = entry
    return cls(encoding or default_encoding, **options)
