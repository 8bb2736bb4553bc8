"""Incremental tokenization: an append-only rendered-token log.

>>> from responses_cache.tokens import get_renderer
>>> r = get_renderer("harmony")                      # doctest: +SKIP
>>> log = r.begin(instructions, tools)               # header only          # doctest: +SKIP
>>> log = r.extend(log, new_items)                   # renders new items only # doctest: +SKIP
>>> ids = r.prompt(log)                              # + "<|start|>assistant" # doctest: +SKIP

See ``docs/tokenization.md``.
"""

from .base import BaseRenderer, Renderer, RenderStats
from .chatml import ChatMLRenderer
from .errors import RenderError, UnknownCallError, UnsupportedContentError, VocabularyError
from .factory import get_renderer
from .harmony import HarmonyRenderer
from .log import TokenLog
from .vocab import VOCAB_DIR_ENV, load_encoding

__all__ = [
    "VOCAB_DIR_ENV",
    "BaseRenderer",
    "ChatMLRenderer",
    "HarmonyRenderer",
    "RenderError",
    "RenderStats",
    "Renderer",
    "TokenLog",
    "UnknownCallError",
    "UnsupportedContentError",
    "VocabularyError",
    "get_renderer",
    "load_encoding",
]
