"""``RedisRateLimiter``: the quota counters in Redis, so limits hold across processes (the redis
extra; see :mod:`responses_cache.limits.quotas` for what is counted).

Layout, per tenant, all under one hash tag so every script stays in one Redis Cluster slot:
``{prefix}{<tenant, hex>}:b`` (a hash: request level ``r``, token level ``t``, as of ``a`` in
milliseconds; it expires once the buckets would be full again), ``…:s`` (a sorted set of the
running responses, scored by when their lease runs out) and ``…:c`` (the same for connections).

**One round trip per turn.** Admitting a turn is one script call. What a turn uses is charged
when it ends without a round trip of its own: the charge (and the freed slot) waits in this
process and travels with the tenant's next admission here, or, at the latest ``flush_s`` later,
with every other waiting charge in one pipelined batch. Other processes therefore see a turn's
tokens at most ``flush_s`` after it ended; this process sees them at once.

A process that dies without releasing its slots loses them for ``response_lease_s`` (responses)
or ``connection_lease_s`` (connections), after which the leases expire. The clock is this
process's (``time.time``): run the servers with synchronised clocks (NTP). When Redis cannot be
reached, requests are admitted (fail open; counted in :attr:`RedisRateLimiter.errors`) and the
charges wait for the next flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..storage.redis_client import FAILURES, redis_client
from .quotas import ALLOWED, Decision, Quota, decide

logger = logging.getLogger("responses_cache.quotas")

# KEYS: bucket hash, running set, connection set (one tenant: one hash tag).
# ARGV: now ms, rpm, tpm, concurrent (0: no limit), mode (admit | peek | charge), lease, lease
#       deadline ms, tokens to charge first, n, then n response leases and the connection leases
#       to release first.
# Returns {verdict, requests level, tokens level (both before this request), running}.
_STEP = """
local now, rpm, tpm, conc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local mode, lease, deadline, charge = ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8])
local n = tonumber(ARGV[9])
for i = 10, 9 + n do redis.call('ZREM', KEYS[2], ARGV[i]) end
for i = 10 + n, #ARGV do redis.call('ZREM', KEYS[3], ARGV[i]) end
local b = redis.call('HMGET', KEYS[1], 'r', 't', 'a')
local r, t, at = tonumber(b[1]), tonumber(b[2]), tonumber(b[3])
if not at then r, t, at = rpm, tpm, now end
local dt = now - at
if dt < 0 then dt = 0 else at = now end
if rpm > 0 then r = math.min(rpm, r + dt * rpm / 60000) end
if tpm > 0 then t = math.min(tpm, t + dt * tpm / 60000) end
t = t - charge
local running = 0
if conc > 0 or mode == 'peek' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  running = redis.call('ZCARD', KEYS[2])
end
local verdict, before = 'ok', r
if mode == 'admit' then
  if rpm > 0 and r < 1 then verdict = 'requests'
  elseif tpm > 0 and t < 0 then verdict = 'tokens'
  elseif conc > 0 and running >= conc then verdict = 'concurrent_responses'
  else
    if rpm > 0 then r = r - 1 end
    if conc > 0 then
      redis.call('ZADD', KEYS[2], deadline, lease)
      redis.call('PEXPIRE', KEYS[2], math.max(1, tonumber(deadline) - now))
    end
  end
end
if rpm > 0 or tpm > 0 then
  local full = 0
  if rpm > 0 then full = math.max(full, (rpm - r) * 60000 / rpm) end
  if tpm > 0 then full = math.max(full, (tpm - t) * 60000 / tpm) end
  redis.call('HSET', KEYS[1], 'r', tostring(r), 't', tostring(t), 'a', tostring(at))
  redis.call('PEXPIRE', KEYS[1], math.ceil(full) + 1000)
end
return {verdict, tostring(before), tostring(t), running}
"""

# KEYS: connection set. ARGV: now ms, limit, lease, deadline ms, then connection leases to release.
_CONNECT = """
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 5, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.max(1, tonumber(ARGV[4]) - now))
return 1
"""


@dataclass(slots=True)
class _Pending:
    """What this process owes Redis for one tenant."""

    quota: Quota
    tokens: int = 0
    responses: list[str] = field(default_factory=list)
    connections: list[str] = field(default_factory=list)

    def merge(self, other: _Pending) -> None:
        self.tokens += other.tokens
        self.responses += other.responses
        self.connections += other.connections


class RedisRateLimiter:
    """``RedisRateLimiter("redis://127.0.0.1:6379/0")`` or ``client=`` an existing
    ``redis.asyncio`` client (then its owner closes it). Close with :meth:`aclose` (it sends
    what is still waiting)."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        client: Any = None,
        prefix: str = "rc:q:",
        flush_s: float = 0.05,
        response_lease_s: float = 15 * 60.0,
        connection_lease_s: float = 65 * 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._owns_client = client is None
        if client is None:
            client = redis_client(url)
        self._client = client
        self.prefix = prefix
        self.flush_s = flush_s
        self.response_lease_s = response_lease_s
        self.connection_lease_s = connection_lease_s
        self.clock = clock
        self._step = client.register_script(_STEP)
        self._connect = client.register_script(_CONNECT)
        self._pending: dict[str, _Pending] = {}
        self._flusher: asyncio.Task[None] | None = None
        #: Round trips made (a pipelined batch counts once).
        self.round_trips = 0
        #: Calls that failed (the request was admitted; the charge waits).
        self.errors = 0

    def _keys(self, tenant: str) -> list[str]:
        base = f"{self.prefix}{{{tenant.encode().hex()}}}:"
        return [base + "b", base + "s", base + "c"]

    def _args(self, quota: Quota, mode: str, lease: str, now_ms: int, owed: _Pending | None) -> list[Any]:
        return [
            now_ms, quota.requests_per_minute or 0, quota.tokens_per_minute or 0, quota.concurrent_responses or 0,
            mode, lease, now_ms + int(self.response_lease_s * 1000), owed.tokens if owed else 0,
            len(owed.responses) if owed else 0, *(owed.responses if owed else ()), *(owed.connections if owed else ()),
        ]

    async def _run_step(self, tenant: str, quota: Quota, mode: str, lease: str) -> Decision | None:
        owed = self._pending.pop(tenant, None)
        now_ms = int(self.clock() * 1000)
        self.round_trips += 1
        try:
            verdict, requests, tokens, running = await self._step(
                keys=self._keys(tenant), args=self._args(quota, mode, lease, now_ms, owed)
            )
        except FAILURES:
            self.errors += 1
            logger.exception("the quota counters in Redis cannot be reached: admitting the request")
            if owed is not None:
                self._owe(tenant, owed)
            return None
        text = verdict.decode() if isinstance(verdict, bytes) else str(verdict)
        return decide(
            quota, float(requests), float(tokens), int(running), count=mode == "admit", verdict=text if mode == "admit" else None
        )

    async def admit(self, tenant: str, quota: Quota, lease: str) -> Decision:
        return await self._run_step(tenant, quota, "admit", lease) or ALLOWED

    async def peek(self, tenant: str, quota: Quota) -> Decision:
        return await self._run_step(tenant, quota, "peek", "") or ALLOWED

    def finish(self, tenant: str, quota: Quota, lease: str, tokens: int) -> None:
        owed = _Pending(quota, tokens if quota.tokens_per_minute is not None else 0)
        owed.responses.append(lease)
        self._owe(tenant, owed)

    async def connect(self, tenant: str, quota: Quota, lease: str) -> Decision:
        if quota.connections is None:
            return ALLOWED
        owed = self._pending.get(tenant)
        released = owed.connections if owed is not None else []
        now_ms = int(self.clock() * 1000)
        self.round_trips += 1
        try:
            ok = await self._connect(
                keys=[self._keys(tenant)[2]],
                args=[now_ms, quota.connections, lease, now_ms + int(self.connection_lease_s * 1000), *released],
            )
        except FAILURES:
            self.errors += 1
            logger.exception("the quota counters in Redis cannot be reached: admitting the connection")
            return ALLOWED
        if owed is not None:
            owed.connections = owed.connections[len(released) :]
        if not ok:
            return Decision(False, "connections", 1.0)
        return ALLOWED

    def disconnect(self, tenant: str, quota: Quota, lease: str) -> None:
        owed = _Pending(quota)
        owed.connections.append(lease)
        self._owe(tenant, owed)

    def _owe(self, tenant: str, owed: _Pending) -> None:
        held = self._pending.get(tenant)
        if held is None:
            self._pending[tenant] = owed
        else:
            held.merge(owed)
        if self._flusher is None or self._flusher.done():
            with contextlib.suppress(RuntimeError):  # no running loop: the next call flushes
                self._flusher = asyncio.get_running_loop().create_task(self._flush_soon(), name="responses_cache.quotas.flush")

    async def _flush_soon(self) -> None:
        while self._pending:
            await asyncio.sleep(self.flush_s)
            await self.flush()

    async def flush(self) -> None:
        """Send every waiting charge now, in one pipelined round trip."""
        batch, self._pending = self._pending, {}
        if not batch:
            return
        now_ms = int(self.clock() * 1000)
        self.round_trips += 1
        steps = {tenant: (self._keys(tenant), self._args(owed.quota, "charge", "", now_ms, owed))
                 for tenant, owed in batch.items()}
        failed: list[str] = []
        if hasattr(self._client, "get_nodes"):
            # A cluster pipeline refuses scripts: the charges go to their nodes concurrently.
            outcomes = await asyncio.gather(*(self._step(keys=k, args=a) for k, a in steps.values()),
                                            return_exceptions=True)
            failed = [t for t, o in zip(steps, outcomes, strict=True) if isinstance(o, BaseException)]
            for outcome in outcomes:
                if isinstance(outcome, BaseException) and not isinstance(outcome, FAILURES):
                    raise outcome
        else:
            try:
                async with self._client.pipeline(transaction=False) as pipe:
                    for keys, args in steps.values():
                        await self._step(keys=keys, args=args, client=pipe)
                    await pipe.execute()
            except FAILURES:
                failed = list(steps)
        if failed:
            self.errors += 1
            logger.error("the quota counters in Redis cannot be reached: the charges of %d tenants wait", len(failed))
            for tenant in failed:
                owed = batch[tenant]
                held = self._pending.get(tenant)
                if held is not None:
                    owed.merge(held)
                self._pending[tenant] = owed

    @property
    def pending(self) -> int:
        """Tenants with charges waiting to be sent."""
        return len(self._pending)

    async def aclose(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(BaseException):
                await self._flusher
        with contextlib.suppress(Exception):
            await self.flush()
        if self._owns_client:
            await self._client.aclose()

    def keys_of(self, tenant: str) -> Sequence[str]:
        """The tenant's keys (all in one cluster slot)."""
        return tuple(self._keys(tenant))
