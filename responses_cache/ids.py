"""Identifiers in OpenAI's style (``resp_…``, ``msg_…``, ``fc_…``, ``call_…``, ``rs_…``).

A response id is ``resp_`` and 32 hex digits. A continuation's id keeps its parent's first
:data:`CHAIN_TAG_HEX` digits (the **chain tag**) and draws the rest at random, so every response
of a conversation carries the tag of its first one: a shared store can keep a conversation's keys
together (one Redis Cluster slot) while different conversations spread out."""

from __future__ import annotations

import os
import re

#: Hex digits of a response id that a continuation inherits from its parent (32 bits: enough to
#: spread conversations over Redis Cluster's 16,384 slots; 96 random bits remain).
CHAIN_TAG_HEX = 8

_RESPONSE_ID = re.compile(r"resp_[0-9a-f]{32}")


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(16).hex()}"


def chain_tag(response_id: str) -> str | None:
    """The chain tag of an id :func:`new_response_id` made (``None`` for an id of another shape:
    ids written by hand, or by another server)."""
    if _RESPONSE_ID.fullmatch(response_id):
        return response_id[5 : 5 + CHAIN_TAG_HEX]
    return None


def new_response_id(previous_response_id: str | None = None) -> str:
    """A new ``resp_…`` id: with a parent of this shape, one that carries the parent's chain tag."""
    random = os.urandom(16).hex()
    tag = chain_tag(previous_response_id) if previous_response_id else None
    return f"resp_{tag}{random[CHAIN_TAG_HEX:]}" if tag else f"resp_{random}"
