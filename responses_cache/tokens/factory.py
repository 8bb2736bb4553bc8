"""``get_renderer``: a renderer by template name, ``hf:<model>`` for a Hugging Face model, or
``gguf:<file>`` for a GGUF file (llama.cpp)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import BaseRenderer
from .chatml import ChatMLRenderer
from .gguf import GGUF_PREFIX
from .gguf import model_dir as gguf_model_dir
from .harmony import HarmonyRenderer
from .hf import HFRenderer

#: Template name -> (renderer class, default encoding).
TEMPLATES: dict[str, tuple[Callable[..., BaseRenderer], str]] = {
    "harmony": (HarmonyRenderer, "o200k_harmony"),
    "chatml": (ChatMLRenderer, "cl100k_base"),
}
#: Prefix of a Hugging Face model renderer: ``hf:/path/to/model`` (or a cached model id).
HF_PREFIX = "hf:"


def get_renderer(
    template: str = "harmony", *, encoding: str | None = None, **options: Any
) -> BaseRenderer | HFRenderer:
    """A new renderer: ``get_renderer("harmony")``, ``get_renderer("chatml", encoding="o200k_base")``,
    ``get_renderer("hf:/models/Qwen3-8B")`` (the model's own tokenizer and chat template),
    ``get_renderer("gguf:/models/qwen3-8b-q4_k_m.gguf")`` (the GGUF's, see :mod:`.gguf`).

    ``options`` go to the renderer class (e.g. ``reasoning_effort="high"``, ``vocab_dir=...``;
    for ``hf:`` ``history="keep"``, ``template_kwargs={...}``, ``chat_template=...``).
    Vocabularies are loaded once per process, so creating renderers is cheap.
    """
    if template.startswith(GGUF_PREFIX):
        if encoding is not None:
            raise ValueError("a gguf: renderer uses the file's own tokenizer; leave encoding out")
        return HFRenderer(str(gguf_model_dir(template[len(GGUF_PREFIX) :])), **options)
    if template.startswith(HF_PREFIX):
        if encoding is not None:
            raise ValueError("an hf: renderer uses the model's own tokenizer; leave encoding out")
        return HFRenderer(template[len(HF_PREFIX) :], **options)
    entry = TEMPLATES.get(template)
    if entry is None:
        raise ValueError(
            f"unknown template {template!r}; expected one of {', '.join(TEMPLATES)}, hf:<model directory> "
            "or gguf:<file>"
        )
    cls, default_encoding = entry
    return cls(encoding or default_encoding, **options)
