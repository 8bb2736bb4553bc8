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

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from ..protocol.codec import encode
from ..protocol.items import Item
from ..protocol.response import Response
from ..tokens.snapshot import LogDelta

#: Longest chain a store walks before giving up (a guard against cycles and runaway chains).
MAX_CHAIN = 100_000

#: The memory store's bounds by default (docs/limits.md): responses, bytes of all tenants
#: together, and bytes of one tenant.
DEFAULT_STORE_RESPONSES = 100_000
DEFAULT_STORE_BYTES = 1024**3
DEFAULT_STORE_TENANT_BYTES = 256 * 1024**2

#: Statuses of a response still running (in the background): the memory store never evicts it,
#: so that it can be retrieved and cancelled until it ends (it is stored again then).
RUNNING = ("queued", "in_progress")

#: Which of the memory store's bounds pushed a response out.
Bound = Literal["tenant_bytes", "bytes", "responses"]


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


def stored_bytes(stored: StoredResponse) -> int:
    """Approximate bytes a stored response holds: the same measure as the caches' (the encoded
    bytes of its items, here with the Response object around its output, plus its token array),
    and :data:`ENTRY_BYTES` for the objects and keys an entry adds."""
    size = ENTRY_BYTES + len(encode(stored.response)) + sum(len(encode(item)) for item in stored.input_items)
    return size + (stored.snapshot.nbytes if stored.snapshot is not None else 0)


#: What a stored response costs beyond its encoded bytes: the record, its key and the store's
#: recency links (measured with ``tracemalloc``; tests/unit/test_memory_store.py).
ENTRY_BYTES = 1536


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
    """A bounded in-process store: at most ``max_responses`` responses and ``max_bytes``
    (:func:`stored_bytes`) of all tenants together, and ``max_tenant_bytes`` of any one tenant.

    Least recently used go first (a read, :meth:`get` or a chain, counts as a use). A put that
    takes a tenant over its own bound evicts that tenant's oldest responses only, so one tenant
    cannot push another's out; then the process-wide bounds evict the oldest of any tenant.
    Responses still running in the background (:data:`RUNNING`) are never evicted. A response
    larger than a bound is not kept at all. ``evicted`` is told of each eviction: the bound that
    made it, and the response's tenant and id.
    """

    keeps_snapshots = False
    #: It keeps the very objects it is handed, items included (see :func:`holds_items`).
    holds_items = True

    def __init__(
        self,
        max_responses: int = DEFAULT_STORE_RESPONSES,
        *,
        max_bytes: int = DEFAULT_STORE_BYTES,
        max_tenant_bytes: int = DEFAULT_STORE_TENANT_BYTES,
        evicted: Callable[[Bound, str, str], None] | None = None,
    ) -> None:
        if max_responses <= 0 or max_bytes <= 0 or max_tenant_bytes <= 0:
            raise ValueError("the memory store's bounds must be positive")
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.max_tenant_bytes = max_tenant_bytes
        self.evicted = evicted
        #: Every entry with its size, least recently used first.
        self._data: OrderedDict[tuple[str, str], tuple[StoredResponse, int]] = OrderedDict()
        #: Each tenant's response ids, least recently used first, and its bytes.
        self._tenants: dict[str, OrderedDict[str, None]] = {}
        self._tenant_bytes: dict[str, int] = {}
        self._bytes = 0

    async def put(self, stored: StoredResponse) -> None:
        tenant, key = stored.tenant, (stored.tenant, stored.id)
        self._remove(key)
        size = stored_bytes(stored)
        if size > min(self.max_bytes, self.max_tenant_bytes):
            self._count("tenant_bytes" if size > self.max_tenant_bytes else "bytes", key)
            return
        self._data[key] = (stored, size)
        self._tenants.setdefault(tenant, OrderedDict())[stored.id] = None
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + size
        self._bytes += size
        while self._tenant_bytes.get(tenant, 0) > self.max_tenant_bytes and self._evict_oldest(tenant, "tenant_bytes"):
            pass
        while self._bytes > self.max_bytes and self._evict_oldest(None, "bytes"):
            pass
        while len(self._data) > self.max_responses and self._evict_oldest(None, "responses"):
            pass

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        entry = self._data.get((tenant, response_id))
        if entry is None:
            return None
        self._data.move_to_end((tenant, response_id))
        self._tenants[tenant].move_to_end(response_id)
        return entry[0]

    async def get_chain(self, tenant: str, response_id: str) -> list[StoredResponse] | None:
        return await load_chain(self, tenant, response_id)

    async def contains(self, tenant: str, response_id: str) -> bool:
        return (tenant, response_id) in self._data

    async def delete(self, tenant: str, response_id: str) -> bool:
        return self._remove((tenant, response_id))

    async def aclose(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self._data)

    @property
    def total_bytes(self) -> int:
        """Bytes of every stored response (:func:`stored_bytes`)."""
        return self._bytes

    def tenant_bytes(self, tenant: str) -> int:
        return self._tenant_bytes.get(tenant, 0)

    def _remove(self, key: tuple[str, str]) -> bool:
        entry = self._data.pop(key, None)
        if entry is None:
            return False
        tenant, response_id = key
        ids = self._tenants[tenant]
        del ids[response_id]
        self._bytes -= entry[1]
        if ids:
            self._tenant_bytes[tenant] -= entry[1]
        else:
            del self._tenants[tenant], self._tenant_bytes[tenant]
        return True

    def _evict_oldest(self, tenant: str | None, bound: Bound) -> bool:
        """Evict the least recently used response (of ``tenant``, or of any) that is not running;
        ``False`` when there is none."""
        keys = ((tenant, i) for i in self._tenants[tenant]) if tenant is not None else iter(self._data)
        for key in keys:
            if self._data[key][0].response.status not in RUNNING:
                self._remove(key)
                self._count(bound, key)
                return True
        return False

    def _count(self, bound: Bound, key: tuple[str, str]) -> None:
        if self.evicted is not None:
            self.evicted(bound, *key)


def holds_items(store: object) -> bool:
    """Whether ``store`` keeps a stored response's item objects themselves, in this process (the
    memory store does): the connection caches then leave the history of ``store: true``
    responses unpacked, since the store holds the same items and packing them would only add
    the packed copy. A store without the attribute (Redis, a custom one) does not."""
    return bool(getattr(store, "holds_items", False))


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
