"""Identifiers in OpenAI's style (``resp_…``, ``msg_…``, ``fc_…``, ``call_…``, ``rs_…``).

A conversation's first response id is ``resp_`` and 48 hex digits; each continuation's id keeps
the first :data:`CHAIN_TAG_HEX` of its parent's (the **chain tag**) and draws the rest at random.
So every response of a conversation carries the tag of its first one: a shared store keeps a
conversation's keys together (one Redis Cluster slot) while conversations spread out.

A continuation of an id without a tag (``resp_`` and 32 hex digits, as this server made them
before chain tags; or any other shape) gets such an untagged id too, so the conversation stays
where its first responses are."""

from __future__ import annotations

import os
import re
import secrets
import string

#: Hex digits of a response id that a continuation inherits from its parent (32 bits: enough to
#: spread conversations over Redis Cluster's 16,384 slots; 160 random bits remain).
CHAIN_TAG_HEX = 8

_TAGGED = re.compile(r"resp_[0-9a-f]{48}")


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(16).hex()}"


_ALPHANUMERIC = string.ascii_letters + string.digits


def short_call_id() -> str:
    """A call id of nine letters and digits: the only shape Mistral's chat templates take."""
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))


def chain_tag(response_id: str) -> str | None:
    """The chain tag of an id :func:`new_response_id` made (``None`` for an id of another shape)."""
    if _TAGGED.fullmatch(response_id):
        return response_id[5 : 5 + CHAIN_TAG_HEX]
    return None


def new_response_id(previous_response_id: str | None = None) -> str:
    """A new ``resp_…`` id: a fresh chain tag for a new conversation, the parent's for a
    continuation (none when the parent has none)."""
    if previous_response_id is None:
        return f"resp_{os.urandom(24).hex()}"
    tag = chain_tag(previous_response_id)
    if tag is None:
        return new_id("resp")
    return f"resp_{tag}{os.urandom(24).hex()[CHAIN_TAG_HEX:]}"
