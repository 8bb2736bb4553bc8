"""A custom hook: flags destructive shell commands (``rm -rf /`` and friends) in user text and in
function call arguments. Written against the incremental hook contract:

* it scans only the new items it is given;
* its state (a :class:`BannedState`) carries what it needs to answer for the whole history —
  here, whether the conversation already holds a banned command, and the bytes it scanned;
* with no carried state it starts from scratch (the runner then gives it the full history).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from responses_cache.pipeline.hooks import HookContext, Phase, Verdict
from responses_cache.protocol.items import FunctionCall, Item, Message, text_of

BANNED = re.compile(
    r"\brm\s+(?:-[a-zA-Z]*[rR][a-zA-Z]*\s+-?[a-zA-Z]*\s*|-[a-zA-Z]*[rR][a-zA-Z]*[fF]?\s+)(?:--no-preserve-root\s+)?/(?:\s|$|\*|\"|')"
    r"|\bmkfs(?:\.\w+)?\s+/dev/"
    r"|:\(\)\s*\{\s*:\|:&\s*\};:"
)


@dataclass(frozen=True)
class BannedState:
    bytes_scanned: int = 0
    flagged: bool = False


class BannedCommandHook:
    def __init__(self, *, name: str = "banned_command", phase: Phase = "before") -> None:
        self.name = name
        self.phase: Phase = phase
        self.bytes_scanned = 0

    @staticmethod
    def texts(item: Item) -> list[str]:
        if isinstance(item, Message) and item.role == "user":
            return [text_of(item.content)]
        if isinstance(item, FunctionCall):
            return [item.arguments]
        return []

    async def __call__(self, ctx: HookContext, new_items: Sequence[Item], state: Any) -> Verdict:
        st = state if isinstance(state, BannedState) else BannedState()
        scanned, found = 0, False
        for item in new_items:
            for text in self.texts(item):
                scanned += len(text.encode())
                found = found or BANNED.search(text) is not None
        self.bytes_scanned += scanned
        new = BannedState(st.bytes_scanned + scanned, st.flagged or found)
        if new.flagged:
            return Verdict(
                flagged=True,
                state=new,
                code="banned_command",
                message="The conversation contains a destructive shell command.",
            )
        return Verdict(state=new)
