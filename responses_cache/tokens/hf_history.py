"""The ``hf`` renderer's ``history`` option: whether a log keeps the ids the model sampled.

``"template"`` tokenizes every turn from the template's text, so the prompt always equals the
template's rendering. ``"keep"`` keeps an assistant turn's sampled ids (the generation prompt, the
ids up to the end token, then the text the template puts after it), and through a rewrite of
the text around them keeps the turns whose ids still spell the template's new text; see the
:mod:`.hf` module docstring.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import Literal

from .base import RenderStats
from .hf_encoding import TemplateEncoder
from .hf_log import Piece
from .log import JOINED, Node

History = Literal["template", "keep"]


class HistoryPolicy:
    """Tokenizes turns under the ``history`` option: ``encoder`` for template text, ``decode``
    and ``stops`` (the model's end-of-turn ids) to read sampled ids; counts in ``stats``."""

    def __init__(
        self,
        history: History,
        encoder: TemplateEncoder,
        decode: Callable[[Sequence[int]], str],
        stops: tuple[int, ...],
        stats: RenderStats,
    ) -> None:
        self.history: History = history
        self._encoder = encoder
        self._decode = decode
        self._stops = stops
        self._stats = stats

    def retokenize(self, nodes: Sequence[Node], old: str, new: str, *, whole: bool = True) -> list[int] | None:
        """The ids of ``new``, the template's text from the start of the turn ``nodes`` begins
        with (the log's nodes from there on) after the log's text ``old`` (``whole``: all of it);
        None when tokens would merge across that boundary. With ``history="keep"`` the turns from
        there on whose ids still spell the start of ``new`` keep them, and only the text after
        them is tokenized: what the template rewrote was around the ids the model sampled, not in
        them (Qwen3's empty thinking block, written in the last answer and dropped once a message
        follows it, was never sampled)."""
        if self.history == "keep":
            kept: list[int] = []
            turns = at = 0
            for node in nodes:
                if node.flags & JOINED:
                    continue
                spelled = self._decode(node.seg)
                if not spelled or not new.startswith(spelled, at):
                    break
                kept.extend(node.seg)
                at += len(spelled)
                turns += 1
            if turns:
                rest = self._encoder.after(old + new[:at], new[at:], whole=whole)
                if rest is not None:
                    self._stats.sampled_kept += turns
                    return kept + rest
        return self._encoder.after(old, new, whole=whole)

    def keep_sampled(self, tip: Piece, added: str, sampled: Sequence[int] | None) -> array[int] | None:
        """With ``history="keep"`` and ``sampled`` ids: the new turn's segment built from them
        (:meth:`_sampled_segment`), else None (the turn's text is tokenized)."""
        if sampled is None or self.history != "keep":
            return None
        seg = self._sampled_segment(tip, added, sampled)
        if seg is None:
            self._stats.sampled_rejected += 1
        else:
            self._stats.items_sampled += 1
        return seg

    def _sampled_segment(self, tip: Piece, added: str, sampled: Sequence[int]) -> array[int] | None:
        """The generation prompt, the sampled ids up to the end token, then the tokens of the text
        the template puts after that token. None when the template's text for the turn does not
        start with the generation prompt or has no end token."""
        if tip.gen is None or tip.gen_text is None or not added.startswith(tip.gen_text):
            return None
        body = added[len(tip.gen_text) :]
        ends = {self._decode([t]): t for t in self._stops}
        best = max(((body.rfind(s), s) for s in ends), default=(-1, ""))
        if best[0] < 0:
            return None
        at, stop_text = best
        ids = list(sampled)
        while ids and ids[-1] in self._stops and ids[-1] != ends[stop_text]:
            ids.pop()
        if not ids or ids[-1] != ends[stop_text]:
            ids.append(ends[stop_text])
        trailing = self._encoder.after(stop_text, body[at + len(stop_text) :])
        if trailing is None:
            return None
        seg = array("I", tip.gen)
        seg.extend(ids)
        seg.extend(trailing)
        return seg
