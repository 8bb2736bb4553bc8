"""``item_reference`` input items: finding the item an id refers to.

A client may send ``{"type": "item_reference", "id": "msg_…"}`` instead of an item it already
sent or received (the Vercel AI SDK does so for earlier output when ``store`` is true). Before a
turn runs, every reference is replaced by the item itself, so validation, rendering, storage and
the backend see exactly what a request carrying the item in full would give them. Lookups, in
order, all scoped to the request's tenant:

1. the earlier items of the same ``input``;
2. the connection's items (WebSocket only, ``store`` true or false): :class:`ItemIndex` of the
   session;
3. the process's index of stored items, which points at the stored response holding the item
   (so a deleted or evicted response's items are no longer found);
4. the conversation of the parent (``previous_response_id``), newest first — O(history), only
   when the indexes miss (after a restart, or for items indexed long ago).

Both indexes are bounded LRU maps. A reference that cannot be resolved is a 400
(``item_not_found``, ``param: input[i].id``), except where the backend keeps its own store (the
bridge), which receives it unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cachetools import LRUCache

from ..protocol.codec import encode
from ..protocol.errors import ResponsesError, invalid_request
from ..protocol.items import Item, ItemReference
from .state import ResponseState
from .store import ResponseStore, StoredResponse


class ItemIndex:
    """A bounded map from item id to what is needed to find the item again.

    The connection's index holds the items themselves, bounded by their encoded bytes (an item
    can outlive the cached state it came from, so the index has a budget of its own); the
    process's index holds the id of the stored response that holds each item, bounded by count,
    so the store stays the source of truth.
    """

    def __init__(self, max_items: int, *, max_bytes: int | None = None) -> None:
        self._items: LRUCache[tuple[str, str], Item | str]
        if max_bytes is None:
            self._items = LRUCache(maxsize=max(1, max_items))
        else:
            self._items = LRUCache(maxsize=max(1, max_bytes), getsizeof=_entry_bytes)
        self._max_items = max(1, max_items)
        self._by_bytes = max_bytes is not None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        """Bytes held (0 for an index bounded by count)."""
        return int(self._items.currsize) if self._by_bytes else 0

    def add(self, tenant: str, items: Iterable[Item], response_id: str | None = None) -> None:
        """Index every item that has an id: the item itself, or ``response_id`` when given."""
        for item in items:
            item_id = getattr(item, "id", None)
            if not item_id or isinstance(item, ItemReference):
                continue
            value: Item | str = response_id if response_id is not None else item
            try:
                self._items[(tenant, item_id)] = value
            except ValueError:  # larger than the whole budget: not referenceable
                self._items.pop((tenant, item_id), None)
                continue
            while len(self._items) > self._max_items:
                self._items.popitem()

    def get(self, tenant: str, item_id: str) -> Item | str | None:
        return self._items.get((tenant, item_id))

    def clear(self) -> None:
        self._items.clear()


def _entry_bytes(value: Item | str) -> int:
    return 64 + (len(value) if isinstance(value, str) else len(encode(value)))


def has_references(items: Sequence[Item]) -> bool:
    return any(isinstance(item, ItemReference) for item in items)


async def resolve_references(
    items: list[Item],
    tenant: str,
    *,
    connection: ItemIndex | None,
    process: ItemIndex | None,
    store: ResponseStore | None,
    parent: ResponseState | None,
    pass_through: bool = False,
) -> list[Item]:
    """``items`` with every :class:`ItemReference` replaced by the item it refers to."""
    if not has_references(items):
        return items
    earlier: dict[str, Item] = {}
    in_parent: dict[str, Item] | None = None  # built once, on the first miss (O(history) once)
    fetched: dict[str, StoredResponse | None] = {}  # one store read per stored response
    out: list[Item] = []
    for index, item in enumerate(items):
        if not isinstance(item, ItemReference):
            item_id = getattr(item, "id", None)
            if item_id:
                earlier[item_id] = item
            out.append(item)
            continue
        found = earlier.get(item.id)
        if found is None and connection is not None:
            local = connection.get(tenant, item.id)
            found = local if not isinstance(local, str) else None
        if found is None and process is not None and store is not None:
            found = await _from_store(process, store, tenant, item.id, fetched)
        if found is None and parent is not None:
            if in_parent is None:
                in_parent = {}
                for old in parent.conversation.reversed_items():
                    old_id = getattr(old, "id", None)
                    if old_id:
                        in_parent.setdefault(old_id, old)  # the newest item with that id
            found = in_parent.get(item.id)
        if found is None or isinstance(found, ItemReference):
            if pass_through:
                out.append(item)
                continue
            raise item_not_found(item.id, index)
        out.append(found)
    return out


async def _from_store(
    process: ItemIndex, store: ResponseStore, tenant: str, item_id: str, fetched: dict[str, StoredResponse | None]
) -> Item | None:
    response_id = process.get(tenant, item_id)
    if not isinstance(response_id, str):
        return None
    if response_id not in fetched:
        fetched[response_id] = await store.get(tenant, response_id)
    stored = fetched[response_id]
    if stored is None:
        return None
    for item in (*stored.input_items, *stored.response.output):
        if getattr(item, "id", None) == item_id:
            return item
    return None


def item_not_found(item_id: str, index: int) -> ResponsesError:
    return invalid_request(
        f"Item with id '{item_id}' not found. Items are not persisted when `store` is set to false. "
        "Try again with `store` set to true, or remove this item from your input.",
        f"input[{index}].id",
        "item_not_found",
    )
