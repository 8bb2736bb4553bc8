"""A persistent, append-only conversation: each response adds a node that points at its parent.

A continuation never copies the history: it adds one node holding only its own items. Forks are
two nodes with the same parent. Walking to the root (``items()``) is O(history) and happens only
where a consumer really needs every item (a full re-render, a message-based backend).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..protocol.items import Item


class Conversation:
    __slots__ = ("_items", "count", "parent")

    def __init__(self, parent: Conversation | None, items: Sequence[Item]) -> None:
        self.parent = parent
        self._items: tuple[Item, ...] = tuple(items)
        self.count: int = (parent.count if parent else 0) + len(self._items)

    @property
    def own_items(self) -> tuple[Item, ...]:
        """The items this node added."""
        return self._items

    def extend(self, items: Sequence[Item]) -> Conversation:
        """A child conversation; ``self`` is shared, not copied."""
        if not items:
            return self
        return Conversation(self, items)

    def items(self) -> list[Item]:
        """Every item from the root, in order (O(history))."""
        chunks: list[tuple[Item, ...]] = []
        node: Conversation | None = self
        while node is not None:
            if node._items:
                chunks.append(node._items)
            node = node.parent
        out: list[Item] = []
        for chunk in reversed(chunks):
            out.extend(chunk)
        return out

    def reversed_items(self) -> Iterator[Item]:
        """Items from the newest backwards; stops early when the consumer does."""
        node: Conversation | None = self
        while node is not None:
            yield from reversed(node._items)
            node = node.parent

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"Conversation(count={self.count})"


EMPTY = Conversation(None, ())
