"""Shared test helpers."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from responses_cache.protocol.items import Item
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.tokens import BaseRenderer


def canonical_ids(r: BaseRenderer, outputs: Sequence[Item]) -> array[int]:
    """What a model following the template exactly would sample for ``outputs`` (one turn).

    For ChatML the newline after the last ``<|im_end|>`` is left out: models stop at
    ``<|im_end|>``, the newline is the template's.
    """
    ids = array("I")
    for item in outputs:
        ids.extend(r.extend(r.begin(None, EMPTY_TOOLS), [item]).item_tokens(0))
    gen = r.generation_prompt
    assert ids[: len(gen)] == gen
    ids = ids[len(gen) :]
    if r.template == "chatml":
        newline = r.encode_text("\n")
        assert list(ids[-len(newline) :]) == newline
        ids = ids[: -len(newline)]
    return ids
