"""Identifiers in OpenAI's style (``resp_…``, ``msg_…``, ``fc_…``, ``call_…``, ``rs_…``)."""

from __future__ import annotations

import os


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(16).hex()}"
