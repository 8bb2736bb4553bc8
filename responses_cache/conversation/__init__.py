"""A persistent, append-only conversation: each response adds a node that points at its parent.

A continuation never copies the history: it adds one node holding only its own items. Forks are
two nodes with the same parent. Walking to the root (``items()``) is O(history) and happens only
where a consumer really needs every item (a full re-render, a message-based backend).

Once a node is behind the newest one of a cached conversation (:meth:`Conversation.pack_behind`),
its items are packed (:mod:`.packing`): every reader still gets equal items, unpacked for it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..protocol.items import Item
from .packing import PackedItems, pack, unpack


class Conversation:
    __slots__ = ("_items", "_settled", "count", "parent")

    def __init__(self, parent: Conversation | None, items: Sequence[Item]) -> None:
        self.parent = parent
        own = tuple(items)
        #: The items, or their packed form. One slot, swapped in one store: a reader on another
        #: thread (a render offloaded to a worker) sees either form whole.
        self._items: tuple[Item, ...] | PackedItems = own
        #: :meth:`pack_behind` has been past this node (packed or not): it stops here.
        self._settled = False
        self.count: int = (parent.count if parent else 0) + len(own)

    @property
    def own_items(self) -> tuple[Item, ...]:
        """The items this node added (unpacked when the node is packed: O(their size))."""
        return _unpacked(self._items)

    @property
    def packed(self) -> bool:
        """Whether this node holds its items packed."""
        return not isinstance(self._items, tuple)

    @property
    def held(self) -> tuple[Item, ...] | PackedItems:
        """What this node keeps for its items: their tuple, or their packed form (for memory
        accounting; read the items with :attr:`own_items`)."""
        return self._items

    def extend(self, items: Sequence[Item]) -> Conversation:
        """A child conversation; ``self`` is shared, not copied."""
        if not items:
            return self
        return Conversation(self, items)

    def pack_behind(self) -> int:
        """Pack the items of the nodes behind this one, back to the first node an earlier call
        went past; this node stays as it is (the next turn continues from it). Each node is
        visited once in its life, so a conversation grown a turn at a time costs O(the items
        added since) per call, never O(history). Returns how many nodes it packed."""
        packed = 0
        node = self.parent
        while node is not None and not node._settled:
            node._settled = True
            items = node._items
            if isinstance(items, tuple) and items:
                form = pack(items)
                if form is not None:
                    node._items = form
                    packed += 1
            node = node.parent
        return packed

    def unpack_all(self) -> int:
        """Unpack, in place, every packed node of this conversation: for a reader about to read
        them all again and again (a client that resends its whole input, matched item by item
        each turn). O(history); returns how many nodes it unpacked."""
        unpacked = 0
        node: Conversation | None = self
        while node is not None:
            held = node._items
            if not isinstance(held, tuple):
                node._items = unpack(held)
                unpacked += 1
            node = node.parent
        return unpacked

    def items(self) -> list[Item]:
        """Every item from the root, in order (O(history))."""
        chunks: list[tuple[Item, ...] | PackedItems] = []
        node: Conversation | None = self
        while node is not None:
            held = node._items  # read once: see ``__init__``
            if held:
                chunks.append(held)
            node = node.parent
        out: list[Item] = []
        for chunk in reversed(chunks):
            out.extend(_unpacked(chunk))
        return out

    def reversed_items(self) -> Iterator[Item]:
        """Items from the newest backwards; stops early when the consumer does (and unpacks only
        the nodes it reaches)."""
        node: Conversation | None = self
        while node is not None:
            yield from reversed(_unpacked(node._items))
            node = node.parent

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"Conversation(count={self.count})"


def _unpacked(items: tuple[Item, ...] | PackedItems) -> tuple[Item, ...]:
    return items if isinstance(items, tuple) else unpack(items)


EMPTY = Conversation(None, ())
