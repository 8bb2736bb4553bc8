"""Reference safety hooks for the pipeline's incremental hook contract.

* :class:`SecretDetector` blocks or redacts credentials in user text and tool outputs;
* :class:`PatternPolicy` flags regex/keyword matches (with a conversation-wide threshold);
* :class:`ModerationHook` asks an external moderation service (the ML-classifier pattern).

Each scans only a turn's new items and carries a :class:`ScanState`; its verdict equals the one a
scan of the whole history would give (see ``responses_cache.testing.check_hook_equivalence``).
"""

from __future__ import annotations

from .base import DEFAULT_SCOPE, ScanState, Scope, scanned_bytes, texts_of
from .moderation import ModerationHook, ModerationUnavailable
from .patterns import PatternPolicy
from .secrets import SECRET_PATTERNS, SecretDetector

__all__ = [
    "DEFAULT_SCOPE",
    "SECRET_PATTERNS",
    "ModerationHook",
    "ModerationUnavailable",
    "PatternPolicy",
    "ScanState",
    "Scope",
    "SecretDetector",
    "scanned_bytes",
    "texts_of",
]
