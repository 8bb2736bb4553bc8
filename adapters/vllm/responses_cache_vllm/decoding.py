"""Local detokenization of sampled ids with the renderer's encoding.

Token boundaries do not fall on character boundaries: the bytes of a multi-byte character may
arrive in two chunks. The decoder keeps incomplete UTF-8 back until the rest arrives.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any


class IncrementalDecoder:
    def __init__(self, encoding: Any) -> None:
        self._encoding = encoding
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Sequence[int]) -> str:
        data: bytes = self._encoding.decode_bytes(list(ids))
        return str(self._utf8.decode(data))

    def close(self) -> str:
        return str(self._utf8.decode(b"", final=True))
