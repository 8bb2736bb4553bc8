"""``responses_cache.sealing``, the documented import path of :mod:`responses_cache.conversation.sealing`.

It re-exports that module's public names (the module moved when the package was grouped by
role). Patch or extend the module itself, not this one."""

from .conversation.sealing import (
    KEY_BYTES,
    PREFIX,
    Sealer,
    SealError,
    new_key,
)

__all__ = [
    "KEY_BYTES",
    "PREFIX",
    "SealError",
    "Sealer",
    "new_key",
]
