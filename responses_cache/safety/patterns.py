"""``PatternPolicy``: a regex/keyword content policy with a conversation-wide threshold.

The policy counts matches over the whole conversation and flags once the count reaches
``threshold`` (``1``: any match). The count is carried in the hook state, so each turn scans only
its new items and still gives the verdict a scan of the full history would.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from ..pipeline.hooks import HookContext, Phase, Verdict
from ..protocol.items import Item
from .base import DEFAULT_SCOPE, Scope, carried, texts_of


class PatternPolicy:
    def __init__(
        self,
        patterns: Iterable[str | re.Pattern[str]] = (),
        keywords: Iterable[str] = (),
        *,
        name: str = "patterns",
        phase: Phase = "before",
        scope: Iterable[Scope] = DEFAULT_SCOPE,
        threshold: int = 1,
        code: str = "content_filter",
        message: str = "The input was flagged by a content policy.",
    ) -> None:
        compiled = [p if isinstance(p, re.Pattern) else re.compile(p) for p in patterns]
        words = [w for w in keywords if w]
        if words:
            alternation = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
            compiled.append(re.compile(rf"(?<!\w)(?:{alternation})(?!\w)", re.IGNORECASE))
        if not compiled:
            raise ValueError("PatternPolicy needs at least one pattern or keyword")
        if threshold < 1:
            raise ValueError("threshold must be at least 1")
        self.patterns = compiled
        self.name = name
        self.phase: Phase = phase
        self.scope: tuple[Scope, ...] = tuple(scope)
        self.threshold = threshold
        self.code = code
        self.message = message
        self.bytes_scanned = 0

    def count(self, text: str) -> int:
        """Matches of every pattern in ``text`` (each pattern counted separately)."""
        return sum(1 for p in self.patterns for _ in p.finditer(text))

    async def __call__(self, ctx: HookContext, new_items: Sequence[Item], state: Any) -> Verdict:
        st = carried(state)
        scanned = hits = 0
        for item in new_items:
            for text in texts_of(item, self.scope):
                scanned += len(text.encode())
                hits += self.count(text)
        self.bytes_scanned += scanned
        flagged = st.hits + hits >= self.threshold
        new_state = st.advance(scanned, hits, "pattern" if flagged else None, flagged)
        if new_state.flagged:
            return Verdict(flagged=True, state=new_state, code=self.code, message=self.message)
        return Verdict(state=new_state)
