"""``responses_cache.ids``, the documented import path of :mod:`responses_cache.protocol.ids`.

It re-exports that module's public names (the module moved when the package was grouped by
role). Patch or extend the module itself, not this one."""

from .protocol.ids import (
    CHAIN_TAG_HEX,
    chain_tag,
    new_id,
    new_response_id,
    short_call_id,
)

__all__ = [
    "CHAIN_TAG_HEX",
    "chain_tag",
    "new_id",
    "new_response_id",
    "short_call_id",
]
