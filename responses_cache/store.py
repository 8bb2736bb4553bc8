"""Durable response storage (``store: true``): the ``ResponseStore`` protocol and a memory store.

A stored response keeps what a durable store would keep: the Response object, the input items
of its own turn, its output, and its parent's id. A connection cache miss with ``store: true``
*hydrates* the chain from here (walking parent ids), which is correct but slower than the cache.
Everything is scoped by tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cachetools import LRUCache

from .protocol.items import Item
from .protocol.response import Response


@dataclass(frozen=True, slots=True)
class StoredResponse:
    tenant: str
    response: Response
    input_items: tuple[Item, ...]
    instructions: str | None
    tools_json: bytes

    @property
    def id(self) -> str:
        return self.response.id

    @property
    def previous_response_id(self) -> str | None:
        return self.response.previous_response_id


class ResponseStore(Protocol):
    async def put(self, stored: StoredResponse) -> None: ...

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...


class MemoryResponseStore:
    """A bounded in-process store (LRU over ``max_responses`` entries)."""

    def __init__(self, max_responses: int = 100_000) -> None:
        self._data: LRUCache[tuple[str, str], StoredResponse] = LRUCache(maxsize=max_responses)

    async def put(self, stored: StoredResponse) -> None:
        self._data[(stored.tenant, stored.id)] = stored

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        return self._data.get((tenant, response_id))

    async def delete(self, tenant: str, response_id: str) -> bool:
        return self._data.pop((tenant, response_id), None) is not None

    def __len__(self) -> int:
        return len(self._data)


async def load_chain(store: ResponseStore, tenant: str, response_id: str) -> list[StoredResponse] | None:
    """The stored chain ending at ``response_id``, oldest first; ``None`` if any link is missing."""
    chain: list[StoredResponse] = []
    current: str | None = response_id
    seen: set[str] = set()
    while current is not None:
        if current in seen:
            return None
        seen.add(current)
        stored = await store.get(tenant, current)
        if stored is None:
            return None
        chain.append(stored)
        current = stored.previous_response_id
    chain.reverse()
    return chain
