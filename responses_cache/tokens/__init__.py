"""Incremental tokenization: an append-only rendered-token log.

Usage (see ``docs/tokenization.md``)::

    from responses_cache.tokens import get_renderer

    r = get_renderer("harmony")                   # or "chatml", or "hf:/path/to/model" (its own template)
    log = r.begin(instructions, tools)            # header only
    log = r.extend(log, new_input_items)          # renders the new items only
    ids = r.prompt(log)                           # array('I'): log + "<|start|>assistant"
    log = r.extend(log, output_items, sampled=sampled_ids)   # keep what the model produced
"""

from .base import BaseRenderer, Renderer, RenderStats, common_prefix_length
from .chatml import ChatMLRenderer
from .errors import RenderError, UnknownCallError, UnsupportedContentError, VocabularyError
from .factory import get_renderer
from .harmony import HarmonyRenderer
from .hf import HFRenderer
from .log import TokenLog
from .vocab import VOCAB_DIR_ENV, load_encoding

__all__ = [
    "VOCAB_DIR_ENV",
    "BaseRenderer",
    "ChatMLRenderer",
    "HFRenderer",
    "HarmonyRenderer",
    "RenderError",
    "RenderStats",
    "Renderer",
    "TokenLog",
    "UnknownCallError",
    "UnsupportedContentError",
    "VocabularyError",
    "common_prefix_length",
    "get_renderer",
    "load_encoding",
]
