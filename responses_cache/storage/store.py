"""Durable response storage (``store: true``): the ``ResponseStore`` protocol and a memory store.

A stored response keeps what a durable store would keep: the Response object, the input items
of its own turn, its output, and its parent's id — and, optionally, a :class:`LogDelta`: the
token segments its turn added to the rendered log, so another process can rebuild the token log
instead of rendering the whole conversation again. A continuation that misses every cache
*hydrates* the chain from here with :meth:`ResponseStore.get_chain` (one round trip for a remote
store). Everything is scoped by tenant.

A store is owned by whoever created it: the server calls :meth:`ResponseStore.aclose` when it
shuts down, but never closes a store it was handed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cachetools import LRUCache

from ..protocol.items import Item
from ..protocol.response import Response
from ..tokens.snapshot import LogDelta

#: Longest chain a store walks before giving up (a guard against cycles and runaway chains).
MAX_CHAIN = 100_000


@dataclass(frozen=True, slots=True)
class StoredResponse:
    tenant: str
    response: Response
    input_items: tuple[Item, ...]
    instructions: str | None
    tools_json: bytes
    #: The token segments this response's turn added to the rendered log (``None``: not kept).
    snapshot: LogDelta | None = None

    @property
    def id(self) -> str:
        return self.response.id

    @property
    def previous_response_id(self) -> str | None:
        return self.response.previous_response_id


class ResponseStore(Protocol):
    #: Whether the store keeps token-log snapshots (the pipeline computes them only if so).
    keeps_snapshots: bool

    async def put(self, stored: StoredResponse) -> None: ...

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def get_chain(self, tenant: str, response_id: str) -> list[StoredResponse] | None:
        """The chain ending at ``response_id``, oldest first; ``None`` if any link is missing."""
        ...

    async def contains(self, tenant: str, response_id: str) -> bool:
        """Whether the response is still stored (not deleted, not expired)."""
        ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...

    async def aclose(self) -> None:
        """Release connections; called once by the store's owner."""
        ...


class MemoryResponseStore:
    """A bounded in-process store (LRU over ``max_responses`` entries)."""

    keeps_snapshots = False

    def __init__(self, max_responses: int = 100_000) -> None:
        self._data: LRUCache[tuple[str, str], StoredResponse] = LRUCache(maxsize=max_responses)

    async def put(self, stored: StoredResponse) -> None:
        self._data[(stored.tenant, stored.id)] = stored

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        return self._data.get((tenant, response_id))

    async def get_chain(self, tenant: str, response_id: str) -> list[StoredResponse] | None:
        return await load_chain(self, tenant, response_id)

    async def contains(self, tenant: str, response_id: str) -> bool:
        return (tenant, response_id) in self._data

    async def delete(self, tenant: str, response_id: str) -> bool:
        return self._data.pop((tenant, response_id), None) is not None

    async def aclose(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self._data)


class _Getter(Protocol):
    async def get(self, tenant: str, response_id: str) -> StoredResponse | None: ...


async def load_chain(store: _Getter, tenant: str, response_id: str) -> list[StoredResponse] | None:
    """The stored chain ending at ``response_id``, oldest first, one ``get`` per link; ``None``
    if any link is missing. For stores where a lookup is cheap (in process)."""
    chain: list[StoredResponse] = []
    current: str | None = response_id
    seen: set[str] = set()
    while current is not None:
        if current in seen or len(chain) >= MAX_CHAIN:
            return None
        seen.add(current)
        stored = await store.get(tenant, current)
        if stored is None:
            return None
        chain.append(stored)
        current = stored.previous_response_id
    chain.reverse()
    return chain
