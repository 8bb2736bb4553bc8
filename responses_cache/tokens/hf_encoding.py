"""Template text to token ids for the ``hf`` renderer, a turn at a time.

The renderer appends the template's text for new items to a log whose text is already
tokenized. :class:`TemplateEncoder` gives the ids that text adds: the model's tokenizer splits its
added tokens (``<|im_start|>``, ``<|eot_id|>``…) out before anything else, so nothing merges
across one, and encoding from the last added token of the old text on gives the new text's ids
once the few ids before the boundary come out unchanged (checked). It also gives the generation
prompt's ids after a text, cached per (last added token, prompt): the same pair comes back every
turn.
"""

from __future__ import annotations

import re
from array import array
from typing import TYPE_CHECKING

from .base import RenderStats
from .hf_tiktoken import FastEncoder, literals_pattern

if TYPE_CHECKING:
    from tokenizers import Tokenizer

#: Windows of the old text searched for its last added token (then all of it).
WINDOWS = (2048, 65536)

#: (generation prompt text, its ids, or -- for a whole text -- the whole prompt's ids when the
#: prompt does not extend the conversation's text): see :meth:`TemplateEncoder.generation`.
Generation = tuple[str | None, "array[int] | None", "array[int] | None"]


class TemplateEncoder:
    """Encodes template text (added tokens recognised) with the verified tiktoken encoder when it
    vouches for the ids (``fast``, :mod:`.hf_tiktoken`), else with ``tokenizers``; counts its work
    in ``stats``."""

    def __init__(self, tok: Tokenizer, added: dict[str, int], fast: FastEncoder | None, stats: RenderStats) -> None:
        self.tok = tok
        self.fast = fast
        self._stats = stats
        pattern = literals_pattern(added)
        self._added_re = re.compile(pattern)
        self._added_end_re = re.compile(f"(?:{pattern})$")
        #: (the added token the text ends with, generation prompt) -> the prompt's ids.
        self._gen_cache: dict[tuple[str, str], list[int]] = {}
        #: Short texts from an added token to the end of a turn (``<|im_end|>\n``…) -> their ids.
        self._tail_cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        """Template text's ids (added tokens recognised)."""
        if self.fast is not None:
            fast = self.fast.encode(text)
            if fast is not None:
                self._stats.fast_encodes += 1
                self._stats.tokens_encoded += len(fast)
                return fast
        # ``encode_batch_fast``: the same ids as ``encode``, without computing character offsets.
        ids: list[int] = self.tok.encode_batch_fast([text], add_special_tokens=False)[0].ids
        self._stats.slow_encodes += 1
        self._stats.tokens_encoded += len(ids)
        return ids

    def after(self, old: str, new: str, *, whole: bool = True) -> list[int] | None:
        """The tokens ``new`` adds when the text ``old`` (already tokenized) is followed by it, or
        None when tokens would merge across the boundary. ``whole``: ``old`` is the complete text
        (its start is a boundary); otherwise it is a tail and must hold an added token."""
        if not new:
            return []
        start = None
        for window in (*WINDOWS, None):
            tail = old if window is None else old[-window:]
            last = None
            for last in self._added_re.finditer(tail):  # noqa: B007 - the last match is wanted
                pass
            if last is not None:
                start = len(old) - len(tail) + last.start()
                break
            if window is not None and window >= len(old):
                start = 0
                break
        if start is None or (start == 0 and not whole and not self._added_re.match(old)):
            if not whole:
                return None
            start = 0
        tail = old[start:]
        before = self._tail_cache.get(tail) if len(tail) <= 64 else None
        if before is None:
            before = self.encode(tail) if tail else []
            if len(tail) <= 64 and len(self._tail_cache) < 256:
                self._tail_cache[tail] = before
        both = self.encode(tail + new)
        if both[: len(before)] != before:
            return None
        return both[len(before) :]

    def generation(self, text: str, prompt_text: str, *, whole: bool = True) -> Generation:
        """(generation prompt text, its tokens, or -- ``whole`` texts only -- the whole prompt's
        tokens when the prompt does not extend the conversation's text)."""
        if prompt_text.startswith(text):
            gen_text = prompt_text[len(text) :]
            # The same generation prompt after the same last token comes back every turn.
            last = self._added_end_re.search(text[-64:])
            key = (last.group(), gen_text) if last is not None else None
            ids = self._gen_cache.get(key) if key is not None else None
            if ids is None:
                ids = self.after(text, gen_text, whole=whole)
                if ids is not None and key is not None and len(self._gen_cache) < 64:
                    self._gen_cache[key] = ids
            if ids is not None:
                return gen_text, array("I", ids), None
        if not whole:
            return None, None, None
        return None, None, array("I", self.encode(prompt_text))
