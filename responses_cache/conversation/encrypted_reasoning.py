"""``include: ["reasoning.encrypted_content"]``: reasoning a stateless client carries for the server.

With the option, every reasoning item the server outputs carries ``encrypted_content``: its
reasoning text sealed (:mod:`responses_cache.conversation.sealing`) for the request's tenant. A client that
stores nothing on the server (``store: false`` over HTTP) sends the item back in the next
request's ``input`` — even with its ``content`` left out, as the Responses API lets it — and the
server opens the blob and puts the reasoning back, so the model sees the tool loop's reasoning
exactly as if the server had kept it. A blob that does not open (altered, sealed by another
server or for another tenant) is a 400 ``invalid_encrypted_content`` naming the item.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ..protocol.errors import ResponsesError
from ..protocol.items import Item, Reasoning, ReasoningText
from .sealing import Sealer, SealError

INCLUDE = "reasoning.encrypted_content"
PURPOSE = "reasoning"

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[ReasoningText])


def sealer_for(sealer: Sealer, tenant: str) -> Callable[[Reasoning], Reasoning]:
    """Seals a finished reasoning item's text into its ``encrypted_content`` (for ``tenant``)."""

    def seal(item: Reasoning) -> Reasoning:
        blob = sealer.seal(tenant, PURPOSE, _encode(list(item.content or ())))
        return msgspec.structs.replace(item, encrypted_content=blob)

    return seal


def open_items(sealer: Sealer, tenant: str, items: list[Item]) -> list[Item]:
    """``items`` with every reasoning item's sealed text restored from its ``encrypted_content``
    (the sealed text replaces any ``content`` sent with it); other items unchanged."""
    out = items
    for index, item in enumerate(items):
        if not isinstance(item, Reasoning) or item.encrypted_content is None:
            continue
        try:
            content = _decode.decode(sealer.open(tenant, PURPOSE, item.encrypted_content))
        except (SealError, msgspec.DecodeError, msgspec.ValidationError):
            raise invalid_encrypted_content(item, index) from None
        if out is items:
            out = list(items)
        out[index] = msgspec.structs.replace(item, content=content)
    return out


def invalid_encrypted_content(item: Reasoning, index: int) -> ResponsesError:
    name = f"for item {item.id} " if item.id else ""
    return ResponsesError(
        f"The encrypted content {name}could not be verified.",
        code="invalid_encrypted_content",
        param=f"input[{index}].encrypted_content",
    )
