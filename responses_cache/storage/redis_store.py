"""``RedisResponseStore``: a :class:`~responses_cache.storage.store.ResponseStore` that many processes
share (Redis or Valkey — one server, a Sentinel-managed primary or a Redis Cluster — through the
``redis`` asyncio client: ``pip install 'responses-cache[redis]'``; the URL forms are
:mod:`responses_cache.storage.redis_client`'s).

Layout: one hash per response, ``{prefix}{<tenant, hex>:<chain tag>}:{response_id}``, with its
parent's id (``p``), the record (``d``: the Response, its turn's input items, instructions and
tools, as MessagePack) and, optionally, the token-log delta of its turn (``s``). The tenant is
part of every key, so one tenant can never name another's response. The ``{…}`` hash tag is the
tenant and the **chain tag** (:func:`responses_cache.protocol.ids.chain_tag`: the first hex digits of the
conversation's first response id, which every continuation's id inherits), so a conversation's
keys share one Redis Cluster slot — each script below touches one slot — while conversations,
even one tenant's, spread over the cluster. An id without a chain tag (made before chain tags, or
written by hand) has the tenant alone as its tag, ``{prefix}{<tenant, hex>}:{response_id}``: the
keys of conversations stored by earlier versions keep their names.

* **One round trip per hydration**: a server-side script walks the parent ids and returns every
  link's record (and snapshot) at once; writing a response refreshes the expiry of its whole
  chain in the same way, so a conversation lives ``ttl_s`` after its latest turn.
* **Limits**: a record over ``max_record_bytes`` is not stored (logged and counted; continuing
  it gives ``previous_response_not_found``), a snapshot over ``max_snapshot_bytes`` is left out
  (continuations from it render in full), a chain longer than ``max_chain`` is not hydrated.
* Store failures surface as :class:`StoreUnavailable` (HTTP 503 / a WebSocket ``error`` event).
* **Background responses** (:class:`~responses_cache.core.background.EventRelay`): their events go to
  a stream per response, ``{prefix}{<tenant>:<chain tag>}:ev:{response_id}`` (entry ``0-n`` is
  event ``n-1``, kept ``events_ttl_s``), read by any process with a blocking ``XREAD``; a cancel
  is published on the channel ``{prefix}cancel`` to the process that runs the response (a
  cluster's nodes pass a publish on to every node).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from ..protocol.codec import encode as encode_json
from ..protocol.errors import ResponsesError
from ..protocol.ids import chain_tag
from ..protocol.request import decode_input
from ..protocol.response import Response
from ..tokens.snapshot import LogDelta
from .redis_client import FAILURES as _FAILURES
from .redis_client import redis_client
from .store import MAX_CHAIN, StoredResponse

logger = logging.getLogger("responses_cache.redis_store")

class StoreUnavailable(ResponsesError):
    def __init__(self) -> None:
        super().__init__(
            "The response store is unavailable; try again.", status=503, type="server_error", code="store_unavailable"
        )


class _Record(msgspec.Struct, array_like=True):
    response: Response
    #: The input items as the JSON array the client sent (hosted-tool items kept byte for byte),
    #: read back with the request decoder.
    input_items: bytes
    instructions: str | None
    tools: bytes


_encode = msgspec.msgpack.Encoder().encode
_record = msgspec.msgpack.Decoder(_Record)
_delta = msgspec.msgpack.Decoder(LogDelta)

# KEYS: the response's key (where a cluster client sends the script; every key the script
# touches is ARGV[1] .. an id: the same hash tag, so the same slot).
# ARGV: prefix, max links, response id.  Returns {record, snapshot, record, snapshot, ...}
# newest first, or an empty table when a link is missing or the chain is too long.
_GET_CHAIN = """
local prefix, limit, id = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local out, n = {}, 0
while id ~= '' do
  if n >= limit then return {} end
  local v = redis.call('HMGET', prefix .. id, 'p', 'd', 's')
  if not v[2] then return {} end
  out[2 * n + 1] = v[2]
  out[2 * n + 2] = v[3] or ''
  n = n + 1
  id = v[1] or ''
end
return out
"""

# KEYS: the response's key (as above).
# ARGV: prefix, max links, ttl ms, id, parent id ('' for none), record, snapshot ('' for none).
# Writes the response and pushes the expiry of its ancestors out to the same ttl.
_PUT = """
local prefix, limit, ttl, id, parent = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local key = prefix .. id
redis.call('DEL', key)
if ARGV[7] ~= '' then
  redis.call('HSET', key, 'p', parent, 'd', ARGV[6], 's', ARGV[7])
else
  redis.call('HSET', key, 'p', parent, 'd', ARGV[6])
end
redis.call('PEXPIRE', key, ttl)
local n = 0
while parent ~= '' and n < limit do
  local k = prefix .. parent
  if redis.call('PEXPIRE', k, ttl) == 0 then break end
  parent = redis.call('HGET', k, 'p') or ''
  n = n + 1
end
return 1
"""


class RedisResponseStore:
    """``RedisResponseStore("redis://127.0.0.1:6379/0")`` (any URL
    :func:`~responses_cache.storage.redis_client.redis_client` takes: ``rediss://``, ``redis+sentinel://``,
    ``redis+cluster://``…), or ``client=`` an existing ``redis.asyncio.Redis`` or
    ``redis.asyncio.RedisCluster``; close it with :meth:`aclose`. ``snapshots=False`` neither
    writes nor reads token-log snapshots."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        client: Any = None,
        prefix: str = "rc:",
        ttl_s: float = 30 * 24 * 3600.0,
        snapshots: bool = True,
        max_record_bytes: int = 8 * 1024 * 1024,
        max_snapshot_bytes: int = 8 * 1024 * 1024,
        max_chain: int = MAX_CHAIN,
        events_ttl_s: float = 24 * 3600.0,
    ) -> None:
        #: A client handed in stays its owner's to close; one made here is closed by :meth:`aclose`.
        self._owns_client = client is None
        if client is None:
            client = redis_client(url)
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self._client = client
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.keeps_snapshots = snapshots
        self.max_record_bytes = max_record_bytes
        self.max_snapshot_bytes = max_snapshot_bytes
        self.max_chain = max_chain
        self.events_ttl_s = events_ttl_s
        self._get_chain = client.register_script(_GET_CHAIN)
        self._put = client.register_script(_PUT)
        #: Records not stored (over ``max_record_bytes``) and snapshots left out.
        self.oversized_records = 0
        self.oversized_snapshots = 0
        #: Round trips made (one per call).
        self.round_trips = 0
        #: Records or snapshots that could not be decoded (treated as missing).
        self.unreadable = 0

    def _chain_prefix(self, tenant: str, response_id: str) -> str:
        """The prefix of the keys of ``response_id``'s conversation: its hash tag is the tenant
        and the conversation's chain tag (only the tenant for an id without one: the layout of
        the conversations stored before chain tags, which keep their key names)."""
        tag = chain_tag(response_id)
        tenant_hex = tenant.encode().hex()
        return f"{self.prefix}{{{tenant_hex}:{tag}}}:" if tag else f"{self.prefix}{{{tenant_hex}}}:"

    async def put(self, stored: StoredResponse) -> None:
        response = msgspec.structs.replace(stored.response, tools=[])  # tools travel once, as bytes
        items = encode_json(list(stored.input_items))
        data = _encode(_Record(response, items, stored.instructions, stored.tools_json))
        if len(data) > self.max_record_bytes:
            self.oversized_records += 1
            logger.warning("response %s not stored: %d bytes > max_record_bytes", stored.id, len(data))
            return
        snapshot = b""
        if self.keeps_snapshots and stored.snapshot is not None:
            snapshot = _encode(stored.snapshot)
            if len(snapshot) > self.max_snapshot_bytes:
                self.oversized_snapshots += 1
                snapshot = b""
        parent = stored.previous_response_id or ""
        prefix = self._chain_prefix(stored.tenant, stored.id)
        if parent and self._chain_prefix(stored.tenant, parent) != prefix:
            raise ValueError(
                f"response {stored.id!r} does not carry the chain tag of its parent {parent!r}: "
                "make continuation ids with responses_cache.protocol.ids.new_response_id(parent)"
            )
        args = [prefix, self.max_chain, int(self.ttl_s * 1000), stored.id, parent, data, snapshot]
        await self._script(self._put, prefix + stored.id, args)

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        raw = await self._call(self._client.hmget, self._chain_prefix(tenant, response_id) + response_id, "d", "s")
        if raw[0] is None:
            return None
        return self._decode(tenant, raw[0], raw[1] or b"")

    async def get_chain(self, tenant: str, response_id: str) -> list[StoredResponse] | None:
        prefix = self._chain_prefix(tenant, response_id)
        raw = await self._script(self._get_chain, prefix + response_id, [prefix, self.max_chain, response_id])
        if not raw:
            return None
        chain: list[StoredResponse] = []
        for i in range(len(raw) - 2, -1, -2):
            stored = self._decode(tenant, raw[i], raw[i + 1])
            if stored is None:
                return None
            chain.append(stored)
        return chain

    async def ping(self) -> None:
        """One round trip (``PING``), for readiness; raises when Redis does not answer."""
        await self._client.ping()

    async def contains(self, tenant: str, response_id: str) -> bool:
        return bool(await self._call(self._client.exists, self._chain_prefix(tenant, response_id) + response_id))

    async def delete(self, tenant: str, response_id: str) -> bool:
        return bool(await self._call(self._client.delete, self._chain_prefix(tenant, response_id) + response_id))

    # -- background responses (EventRelay) ---------------------------------------------------

    def _events_key(self, tenant: str, response_id: str) -> str:
        return self._chain_prefix(tenant, response_id) + "ev:" + response_id

    async def append_events(self, tenant: str, response_id: str, first: int, frames: Sequence[tuple[bytes, bytes]]) -> None:
        key = self._events_key(tenant, response_id)
        self.round_trips += 1
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for n, (kind, data) in enumerate(frames, start=first + 1):
                    pipe.xadd(key, {"t": kind, "d": data}, id=f"0-{n}")
                pipe.pexpire(key, int(self.events_ttl_s * 1000))
                await pipe.execute()
        except _FAILURES:
            logger.exception("the Redis store failed")
            raise StoreUnavailable() from None

    async def read_events(self, tenant: str, response_id: str, after: int, wait_s: float) -> list[tuple[int, bytes, bytes]]:
        key = self._events_key(tenant, response_id)
        block = int(wait_s * 1000) if wait_s > 0 else None
        got = await self._call(self._client.xread, {key: f"0-{after + 1}"}, 1000, block)
        out: list[tuple[int, bytes, bytes]] = []
        for _stream, entries in got or ():
            for entry_id, fields in entries:
                number = int(entry_id.split(b"-")[1]) - 1
                out.append((number, fields[b"t"], fields[b"d"]))
        return out

    @property
    def _cancel_channel(self) -> str:
        return self.prefix + "cancel"

    async def publish_cancel(self, tenant: str, response_id: str) -> int:
        message = _encode([tenant, response_id])
        return int(await self._call(self._client.publish, self._cancel_channel, message))

    async def listen_cancels(self, on_cancel: Callable[[str, str], None]) -> Callable[[], Awaitable[None]]:
        """Subscribe to the cancel channel (re-subscribing after a connection loss)."""
        # A cluster client learns the slots first (its pub/sub connects to a channel's node).
        await self._client.initialize()
        pubsub = self._client.pubsub()
        await pubsub.subscribe(self._cancel_channel)
        decode = msgspec.msgpack.Decoder(tuple[str, str]).decode

        async def listen() -> None:
            nonlocal pubsub
            pause = 0.1
            while True:
                try:
                    async for message in pubsub.listen():
                        pause = 0.1
                        if message.get("type") != "message":
                            continue
                        try:
                            tenant, response_id = decode(message["data"])
                        except (msgspec.DecodeError, msgspec.ValidationError):
                            continue
                        on_cancel(tenant, response_id)
                except _FAILURES:
                    logger.exception("lost the cancel channel; subscribing again")
                # listen() also ends, with no error and without waiting, on a pub/sub that holds
                # no subscription (a re-subscription that failed, the primary still down): pause
                # and subscribe again either way, never loop at once (that spins the event loop).
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
                with contextlib.suppress(*_FAILURES):
                    await pubsub.aclose()
                    pubsub = self._client.pubsub()
                    await pubsub.subscribe(self._cancel_channel)

        task = asyncio.get_running_loop().create_task(listen(), name="responses_cache.redis.cancels")

        async def stop() -> None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            with contextlib.suppress(Exception):
                await pubsub.aclose()

        return stop

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def _script(self, script: Any, key: str, args: list[Any]) -> Any:
        return await self._call(lambda: script(keys=[key], args=args))

    async def _call(self, fn: Any, *args: Any) -> Any:
        self.round_trips += 1
        try:
            return await fn(*args)
        except _FAILURES:
            logger.exception("the Redis store failed")
            raise StoreUnavailable() from None

    def _decode(self, tenant: str, data: bytes, snapshot: bytes) -> StoredResponse | None:
        """A stored record, or ``None`` when it cannot be read (written by an incompatible
        version, or damaged): as good as missing. An unreadable snapshot is left out."""
        try:
            record = _record.decode(data)
            items = decode_input(record.input_items)
        except (msgspec.DecodeError, msgspec.ValidationError, ResponsesError):
            self.unreadable += 1
            logger.error("an unreadable record in the Redis store (tenant %r)", tenant)
            return None
        delta = None
        if snapshot:
            try:
                delta = _delta.decode(snapshot)
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.unreadable += 1
        response = msgspec.structs.replace(record.response, tools=msgspec.Raw(record.tools))
        return StoredResponse(tenant, response, tuple(items), record.instructions, record.tools, delta)
