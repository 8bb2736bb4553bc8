"""A conversation node's items packed into one compressed blob, and given back on demand.

A cached conversation spends most of its memory on items that nothing reads on an ordinary turn:
a continuation appends to the token log and extends the newest node, so the items of every node
behind it are read only by a full re-render, a full-input resend being matched, an
``item_reference`` missed by the indexes, a compaction, a message-based backend. Packed, a node
keeps its items as MessagePack (the items' own schema, ``msgspec``) compressed with zlib
(:data:`LEVEL`): a third to a half of their encoded bytes for text and code, against Python
objects that take more than the encoded bytes (twice or four times as much for a string with one
character outside Latin-1). :func:`unpack` gives back items equal to the packed ones, field for field.

Only what round-trips exactly is packed: :func:`pack` decodes what it encoded and compares it
with the items before it compresses (a value MessagePack cannot carry as it is, such as an
integer past 64 bits or a NaN in ``logprobs``, leaves the node as it was). Items that are not
wire structs (:class:`~responses_cache.protocol.items.HostedItem`, and the opened
:class:`~responses_cache.conversation.compaction.Compaction`, whose summary is never encoded)
are kept as they are, next to the blob, in their places.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import msgspec

from ..protocol.items import Item, WireItem

#: zlib level 2: 0.3-0.5 of the encoded bytes for code and prose (the larger the node, the
#: better), at ~100-150 MB/s (~60 µs for a 2k-token tool output). Level 1 is barely faster in zlib
#: and, in zlib-ng, a quick mode with a worse ratio; level 3 and up cost more for a few percent.
LEVEL = 2

_encode = msgspec.msgpack.Encoder().encode
#: ``None`` holds the place of an item kept beside the blob.
_decoder = msgspec.msgpack.Decoder(list[WireItem | None])
#: What encoding or checking items can raise when a value does not round-trip.
_NOT_PACKABLE = (msgspec.EncodeError, msgspec.DecodeError, OverflowError, TypeError, ValueError)


class Packed:
    """Packed items with some kept as objects: the blob (``None`` in their places) and the kept
    items, in order. Items that are all wire structs pack to the blob alone (``bytes``)."""

    __slots__ = ("data", "kept")

    def __init__(self, data: bytes, kept: tuple[Item, ...]) -> None:
        self.data = data
        self.kept = kept


#: What a packed node holds in place of its items' tuple.
PackedItems = bytes | Packed


@dataclass(slots=True)
class PackStats:
    """Work done by :func:`pack` and :func:`unpack` in this process (for tests and benchmarks;
    counted without a lock, so exact where one thread packs and unpacks)."""

    #: Item tuples packed, the items in them, and their encoded and packed bytes.
    packed: int = 0
    items: int = 0
    encoded_bytes: int = 0
    packed_bytes: int = 0
    #: Item tuples left as they were (nothing to pack, or a value that does not round-trip).
    refused: int = 0
    #: Packed tuples read back.
    unpacked: int = 0


stats = PackStats()


def pack(items: tuple[Item, ...]) -> PackedItems | None:
    """``items`` packed, or ``None`` when packing them would not give back equal items (or there
    are no wire structs among them to pack). O(their size)."""
    wire: list[WireItem | None] = [i if isinstance(i, msgspec.Struct) else None for i in items]
    kept = tuple(i for i in items if not isinstance(i, msgspec.Struct))
    if len(kept) == len(items):
        stats.refused += 1
        return None
    try:
        raw = _encode(wire)
        same = _decoder.decode(raw) == wire
    except _NOT_PACKABLE:
        same = False
    if not same:
        stats.refused += 1
        return None
    data = zlib.compress(raw, LEVEL)
    stats.packed += 1
    stats.items += len(items)
    stats.encoded_bytes += len(raw)
    stats.packed_bytes += len(data)
    return Packed(data, kept) if kept else data


def unpack(packed: PackedItems) -> tuple[Item, ...]:
    """The items :func:`pack` packed (new objects, equal to them). O(their size)."""
    stats.unpacked += 1
    if isinstance(packed, bytes):
        return tuple(_decoder.decode(zlib.decompress(packed)))  # type: ignore[arg-type]
    kept = iter(packed.kept)
    return tuple(next(kept) if i is None else i for i in _decoder.decode(zlib.decompress(packed.data)))
