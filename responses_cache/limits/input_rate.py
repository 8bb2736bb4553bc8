"""Input rate limits: how many request bytes per second one connection, and one tenant's
connections and request bodies together, may have the server take (see ``docs/limits.md``).

Each limit is a token bucket of bytes: it holds up to ``burst`` bytes and refills at ``rate`` bytes
per second. A frame is taken only while its connection's bucket and its tenant's bucket are both
out of debt, and is then charged to both (a large frame may put them in debt); until they are out
of debt again the connection takes nothing more. The WebSocket edge waits *before* decoding the
frame and before asking the server for the next one, so a client that sends faster than its
budget is not read: its bytes wait in its own socket buffers, TCP slows its sends, and the event
loop never sees them (uvicorn stops reading a WebSocket's socket while a received message waits
for the app; see :mod:`~responses_cache.edge.websocket`).

Over any span of ``t`` seconds a connection (or a tenant's connections together) is thus taken at
most ``burst + rate * t`` bytes plus one frame. The buckets read the clock they are given and say
how long to wait; :meth:`ConnectionInput.admit` waits with the sleep it is given (tests run both
on a logical clock).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["ConnectionInput", "InputRate", "InputRateLimits", "TokenBucket"]

#: Defaults: a connection may take 1 MiB/s, a tenant's connections together 2 MiB/s, each after a
#: burst of 16 MiB (one largest message). An agent's turn sends kilobytes; a first turn that
#: resends a long history fits the burst.
DEFAULT_CONNECTION_BYTES_PER_S = 1024 * 1024
DEFAULT_CONNECTION_BURST_BYTES = 16 * 1024 * 1024
DEFAULT_TENANT_BYTES_PER_S = 2 * 1024 * 1024
DEFAULT_TENANT_BURST_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class InputRateLimits:
    """The input budgets: bytes per second and the most taken at once, per connection and per
    tenant (all of its connections in this process together). A rate of ``None`` turns that limit
    off."""

    connection_bytes_per_s: float | None = DEFAULT_CONNECTION_BYTES_PER_S
    connection_burst_bytes: int = DEFAULT_CONNECTION_BURST_BYTES
    tenant_bytes_per_s: float | None = DEFAULT_TENANT_BYTES_PER_S
    tenant_burst_bytes: int = DEFAULT_TENANT_BURST_BYTES

    def __post_init__(self) -> None:
        for name in ("connection_bytes_per_s", "tenant_bytes_per_s"):
            rate = getattr(self, name)
            if rate is not None and not rate > 0:
                raise ValueError(f"{name} must be positive (or None: no limit), got {rate!r}")
        for name in ("connection_burst_bytes", "tenant_burst_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)!r}")


class TokenBucket:
    """Up to ``burst`` bytes, refilled at ``rate`` bytes per second of the caller's clock; a charge
    may overdraw it, and :meth:`wait` says how long until it is out of debt."""

    __slots__ = ("burst", "level", "rate", "updated")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.level = float(burst)
        self.updated = now

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(float(self.burst), self.level + (now - self.updated) * self.rate)
            self.updated = now

    def charge(self, size: int, now: float) -> None:
        self._refill(now)
        self.level -= size

    def wait(self, now: float) -> float:
        """Seconds from ``now`` until the bucket is out of debt (0: it is not in debt)."""
        self._refill(now)
        return 0.0 if self.level >= 0 else -self.level / self.rate

    def full(self, now: float) -> bool:
        self._refill(now)
        return self.level >= self.burst


class InputRate:
    """The process's input budgets: one bucket per connection (:meth:`open`) and one per tenant,
    shared by that tenant's connections. ``clock`` and ``sleep`` are injectable (tests run on a
    logical clock)."""

    def __init__(
        self,
        limits: InputRateLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.limits = limits or InputRateLimits()
        self.clock = clock
        self.sleep = sleep
        #: Tenant buckets with their open connections; a bucket outlives its last connection until
        #: it has refilled (reconnecting does not reset a tenant's budget).
        self._tenants: dict[str, tuple[TokenBucket, int]] = {}
        #: Bytes admitted and seconds waited, all connections (for metrics and tests).
        self.admitted = 0
        self.waited_s = 0.0

    def open(self, tenant: str, *, per_connection: bool = True) -> ConnectionInput:
        """The budget of a new connection of ``tenant`` (``per_connection=False``: its tenant's
        only, as for an HTTP request body); :meth:`ConnectionInput.close` it."""
        now = self.clock()
        self._sweep(now)
        limits = self.limits
        tenant_bucket: TokenBucket | None = None
        if limits.tenant_bytes_per_s is not None:
            bucket, count = self._tenants.get(tenant) or (TokenBucket(limits.tenant_bytes_per_s, limits.tenant_burst_bytes, now), 0)
            self._tenants[tenant] = (bucket, count + 1)
            tenant_bucket = bucket
        own = None
        if per_connection and limits.connection_bytes_per_s is not None:
            own = TokenBucket(limits.connection_bytes_per_s, limits.connection_burst_bytes, now)
        return ConnectionInput(self, tenant, own, tenant_bucket)

    def _closed(self, tenant: str) -> None:
        entry = self._tenants.get(tenant)
        if entry is not None:
            self._tenants[tenant] = (entry[0], entry[1] - 1)

    def _sweep(self, now: float) -> None:
        """Forget tenants with no connection whose bucket has refilled (it would start full anyway)."""
        idle = [t for t, (bucket, count) in self._tenants.items() if count <= 0 and bucket.full(now)]
        for tenant in idle:
            del self._tenants[tenant]

    @property
    def tenants(self) -> int:
        """Tenant buckets held (for tests: they do not pile up)."""
        return len(self._tenants)


class ConnectionInput:
    """One connection's view of the budgets: :meth:`admit` each frame before decoding it."""

    __slots__ = ("_own", "_rate", "_tenant", "_tenant_bucket", "closed")

    def __init__(self, rate: InputRate, tenant: str, own: TokenBucket | None, tenant_bucket: TokenBucket | None) -> None:
        self._rate = rate
        self._tenant = tenant
        self._own = own
        self._tenant_bucket = tenant_bucket
        self.closed = False

    def wait(self) -> float:
        """Seconds until this connection and its tenant are out of debt (0: take a frame now)."""
        now = self._rate.clock()
        return max((b.wait(now) for b in (self._own, self._tenant_bucket) if b is not None), default=0.0)

    def charge(self, size: int) -> None:
        """Charge a frame of ``size`` bytes that is taken now."""
        now = self._rate.clock()
        for bucket in (self._own, self._tenant_bucket):
            if bucket is not None:
                bucket.charge(size, now)
        self._rate.admitted += size

    async def admit(self, size: int) -> None:
        """Wait until this connection and its tenant are out of debt, then charge the frame. A
        frame is taken only while neither is in debt (the first of several connections waiting on
        their tenant takes its frame and puts the tenant back in debt; the others wait again), so
        a tenant's connections together are taken at most ``burst + rate * t`` plus one frame."""
        while (wait := self.wait()) > 0:
            self._rate.waited_s += wait
            await self._rate.sleep(wait)
        self.charge(size)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._tenant_bucket is not None:
                self._rate._closed(self._tenant)
