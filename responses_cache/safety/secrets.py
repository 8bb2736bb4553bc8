"""``SecretDetector``: finds credentials in user text and tool outputs, and blocks or redacts them.

Detected: OpenAI-style keys (``sk-…``, ``sk-proj-…``), Anthropic keys (``sk-ant-…``), AWS access
key ids (``AKIA…``/``ASIA…``), GitHub tokens (``ghp_…``, ``gho_…``, ``ghs_…``, ``ghu_…``, ``ghr_…``,
``github_pat_…``), PEM private keys and ``Authorization: Bearer`` tokens.

Matches are found within one text (a message, a content part, a tool output); a secret split
across two items is not reassembled. The verdict for a turn equals the verdict over the whole
history: ``block`` flags a conversation in which any in-scope text holds a secret; ``redact``
never flags and returns the new items with each secret replaced by ``[REDACTED:<kind>]``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from ..pipeline.hooks import HookContext, Phase, Verdict
from ..protocol.items import Item
from .base import DEFAULT_SCOPE, Scope, carried, rewrite_texts, texts_of

#: kind → pattern. A pattern's ``secret`` group, when present, is the part that is redacted.
SECRET_PATTERNS: dict[str, re.Pattern[str]] = {
    "anthropic_api_key": re.compile(r"\bsk-ant-[A-Za-z0-9]{2,10}-[A-Za-z0-9_\-]{20,}"),
    "openai_api_key": re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}"),
    "aws_access_key_id": re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b"),
    "github_token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),
    "private_key": re.compile(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----)?"
    ),
    "bearer_token": re.compile(
        r"(?i:authorization)\s*:\s*(?i:bearer)\s+(?P<secret>[A-Za-z0-9._~+/=\-]{8,})"
    ),
}


class SecretDetector:
    """Flags (``policy="block"``) or redacts (``policy="redact"``) secrets in new items.

    ``bytes_scanned`` counts every in-scope byte this instance has scanned (for counting tests);
    the carried :class:`~responses_cache.safety.base.ScanState` counts the conversation's.
    """

    def __init__(
        self,
        policy: Literal["block", "redact"] = "block",
        *,
        phase: Phase = "before",
        name: str = "secrets",
        scope: Iterable[Scope] = DEFAULT_SCOPE,
        patterns: dict[str, re.Pattern[str]] | None = None,
        code: str = "secret_detected",
    ) -> None:
        if policy not in ("block", "redact"):
            raise ValueError(f"unknown policy {policy!r}")
        if policy == "redact" and phase != "before":
            raise ValueError("redaction must run before generation (phase='before')")
        self.policy = policy
        self.phase: Phase = phase
        self.name = name
        self.scope: tuple[Scope, ...] = tuple(scope)
        self.patterns = dict(patterns if patterns is not None else SECRET_PATTERNS)
        self.code = code
        self.bytes_scanned = 0

    def find(self, text: str) -> list[str]:
        """The kinds of the secrets in ``text``, in order of appearance (overlaps count once)."""
        order = {kind: i for i, kind in enumerate(self.patterns)}
        matches = sorted(
            (
                (m.start(), -m.end(), order[kind], kind)
                for kind, p in self.patterns.items()
                for m in p.finditer(text)
            ),
        )
        kinds: list[str] = []
        end = -1
        for start, neg_end, _, kind in matches:
            if start >= end:
                kinds.append(kind)
                end = -neg_end
        return kinds

    def redact(self, text: str) -> str:
        for kind, pattern in self.patterns.items():
            text = pattern.sub(functools.partial(_redacted, kind=kind), text)
        return text

    async def __call__(self, ctx: HookContext, new_items: Sequence[Item], state: Any) -> Verdict:
        st = carried(state)
        scanned = hits = 0
        first: str | None = None
        out: list[Item] | None = [] if self.policy == "redact" else None
        changed = False
        for item in new_items:
            for text in texts_of(item, self.scope):
                scanned += len(text.encode())
                kinds = self.find(text)
                hits += len(kinds)
                if kinds and first is None:
                    first = kinds[0]
            if out is not None:
                new = rewrite_texts(item, self.scope, self.redact)
                changed = changed or new is not item
                out.append(new)
        self.bytes_scanned += scanned
        if self.policy == "redact":
            # Redacted text holds no secret: the conversation stays clean.
            return Verdict(
                state=st.advance(scanned, hits, None, False), items=out if changed else None
            )
        new_state = st.advance(scanned, hits, first, hits > 0)
        if not new_state.flagged:
            return Verdict(state=new_state)
        return Verdict(
            flagged=True,
            state=new_state,
            code=self.code,
            message=f"The input contains a secret ({new_state.first}); remove it and try again.",
        )


def _redacted(m: re.Match[str], kind: str) -> str:
    marker = f"[REDACTED:{kind}]"
    if "secret" in m.re.groupindex and m.group("secret") is not None:
        start, end = m.span("secret")
        whole = m.group(0)
        offset = m.start()
        return whole[: start - offset] + marker + whole[end - offset :]
    return marker
