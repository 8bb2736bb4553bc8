"""Per-tenant quotas: requests and tokens per minute, concurrent responses, open connections.

A :class:`Quota` says what one tenant (an API key's tenant, see :class:`~responses_cache.core.auth.BearerKeys`)
may use; :class:`QuotaConfig` gives each tenant its quota (or the default). :class:`Quotas` is the
pipeline stage the edges call: :meth:`Quotas.admit` before a turn runs, :meth:`Admission.release`
when it has ended, :meth:`Quotas.connect` / :meth:`Quotas.disconnect` around a WebSocket
connection. It answers with a :class:`Decision`; the edges only map that to HTTP headers and a 429,
or to a WebSocket ``error`` event. The counters live behind the :class:`RateLimiter` protocol: in
this process (:class:`MemoryRateLimiter`) or in Redis, shared by every process
(:class:`~responses_cache.limits.redis_quotas.RedisRateLimiter`).

**How tokens are counted.** Requests and tokens are token buckets that hold one minute's worth
and refill continuously (``limit / 60`` per second). A turn's tokens — its prompt (``input_tokens``,
counted from the token log) plus what it generated (``output_tokens``) — are known only once it
has ended, so they are charged then, all at once, exactly as they are billed (a cancelled turn's
usage too). The bucket may go below zero; while it is, new turns are refused, with a retry time
of when it is positive again. Over any long window a tenant therefore gets the configured rate
plus at most the tokens of the turns it had running at once (and the first minute's burst).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from cachetools import LRUCache

from ..protocol.errors import ResponsesError

#: Which limit refused a request.
Limit = Literal["requests", "tokens", "concurrent_responses", "connections"]
#: The retry time given when a concurrency limit refuses (nothing says when a slot frees).
CONCURRENCY_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Quota:
    """What one tenant may use; ``None`` is no limit."""

    #: ``response.create`` / ``POST /v1/responses`` per minute.
    requests_per_minute: int | None = None
    #: Prompt plus output tokens per minute (as billed: ``input_tokens + output_tokens``).
    tokens_per_minute: int | None = None
    #: Responses running at once, all connections and processes together.
    concurrent_responses: int | None = None
    #: WebSocket connections open at once.
    connections: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute", "concurrent_responses", "connections"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"Quota.{name} must be a positive integer or None, not {value!r}")

    @property
    def unlimited(self) -> bool:
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.concurrent_responses is None
            and self.connections is None
        )


UNLIMITED = Quota()


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    """Each tenant's quota: its own entry in ``tenants``, else ``default``."""

    default: Quota = UNLIMITED
    tenants: Mapping[str, Quota] = field(default_factory=dict)

    def of(self, tenant: str) -> Quota:
        return self.tenants.get(tenant, self.default)


@dataclass(frozen=True, slots=True)
class Decision:
    """A limiter's answer: whether the request may go, and where the tenant stands.

    The rate fields are ``None`` when the tenant has no such limit. ``reset_*_s`` is how long
    until the bucket is full again (OpenAI's ``x-ratelimit-reset-*``)."""

    allowed: bool
    #: The limit that refused the request (``None`` when allowed).
    refused_by: Limit | None = None
    #: Seconds until a retry can succeed (when refused).
    retry_after_s: float = 0.0
    limit_requests: int | None = None
    remaining_requests: int = 0
    reset_requests_s: float = 0.0
    limit_tokens: int | None = None
    remaining_tokens: int = 0
    reset_tokens_s: float = 0.0


ALLOWED = Decision(True)


class QuotaExceeded(ResponsesError):
    """HTTP 429 ``rate_limit_exceeded``, carrying the limiter's :class:`Decision`."""

    def __init__(self, decision: Decision, quota: Quota) -> None:
        what = {
            "requests": f"requests per minute (limit {quota.requests_per_minute})",
            "tokens": f"tokens per minute (limit {quota.tokens_per_minute})",
            "concurrent_responses": f"concurrent responses (limit {quota.concurrent_responses})",
            "connections": f"open connections (limit {quota.connections})",
        }[decision.refused_by or "requests"]
        super().__init__(
            f"Rate limit reached on {what}. Please try again in {format_duration(decision.retry_after_s)}.",
            status=429,
            type="rate_limit_error",
            code="rate_limit_exceeded",
        )
        self.decision = decision
        self.headers = rate_limit_headers(decision)


class RateLimiter(Protocol):
    """Where the counters live. ``lease`` names the response or connection that holds a
    concurrency slot (distinct per process; a shared limiter expires a lease its process
    never released). :meth:`finish` and :meth:`disconnect` never wait: they are called as turns
    and connections end, cancelled ones included."""

    async def admit(self, tenant: str, quota: Quota, lease: str) -> Decision:
        """Count one request and hold a response slot under ``lease``, unless a limit refuses."""
        ...

    def finish(self, tenant: str, quota: Quota, lease: str, tokens: int) -> None:
        """The response ``lease`` ended having used ``tokens``: charge them, free its slot."""
        ...

    async def connect(self, tenant: str, quota: Quota, lease: str) -> Decision:
        """Hold a connection slot under ``lease``, unless the tenant has all its connections open."""
        ...

    def disconnect(self, tenant: str, quota: Quota, lease: str) -> None: ...

    async def peek(self, tenant: str, quota: Quota) -> Decision:
        """Where the tenant stands, counting nothing."""
        ...


def format_duration(seconds: float) -> str:
    """A duration as OpenAI writes ``x-ratelimit-reset-*``: ``12ms``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    if seconds < 60:
        return f"{_seconds(seconds)}s"
    whole_minutes, rest = divmod(seconds, 60.0)
    hours, minutes = divmod(int(whole_minutes), 60)
    head = f"{hours}h{minutes}m" if hours else f"{minutes}m"
    return f"{head}{_seconds(rest)}s"


def _seconds(value: float) -> str:
    text = f"{math.ceil(value * 1000) / 1000:.3f}".rstrip("0").rstrip(".")
    return text or "0"


class _Bucket:
    """A tenant's request and token levels, as of ``at``."""

    __slots__ = ("at", "requests", "tokens")

    def __init__(self, quota: Quota, now: float) -> None:
        self.requests = float(quota.requests_per_minute or 0)
        self.tokens = float(quota.tokens_per_minute or 0)
        self.at = now

    def refill(self, quota: Quota, now: float) -> None:
        elapsed = max(0.0, now - self.at)
        self.at = max(self.at, now)
        if quota.requests_per_minute is not None:
            rpm = quota.requests_per_minute
            self.requests = min(float(rpm), self.requests + elapsed * rpm / 60.0)
        if quota.tokens_per_minute is not None:
            tpm = quota.tokens_per_minute
            self.tokens = min(float(tpm), self.tokens + elapsed * tpm / 60.0)


def decide(
    quota: Quota, requests: float, tokens: float, running: int, *, count: bool, verdict: str | None = None
) -> Decision:
    """The decision for levels ``requests``/``tokens`` with ``running`` responses. ``count``: a
    request asks (else a peek, which refuses nothing). ``verdict``: the decision already taken by
    the same rule elsewhere (the Redis script: ``ok`` or the refusing limit). The levels are before
    this request is counted; the remaining figures after it."""
    rpm, tpm = quota.requests_per_minute, quota.tokens_per_minute
    refused: Limit | None = None
    if count:
        if verdict is not None:
            refused = None if verdict == "ok" else _LIMITS.get(verdict, "requests")
        elif rpm is not None and requests < 1.0:
            refused = "requests"
        elif tpm is not None and tokens < 0.0:
            refused = "tokens"
        elif quota.concurrent_responses is not None and running >= quota.concurrent_responses:
            refused = "concurrent_responses"
        if refused is None and rpm is not None:
            requests -= 1.0
    retry = 0.0
    if refused == "requests" and rpm is not None:
        retry = max(0.001, (1.0 - requests) * 60.0 / rpm)
    elif refused == "tokens" and tpm is not None:
        retry = max(0.001, -tokens * 60.0 / tpm)
    elif refused is not None:
        retry = CONCURRENCY_RETRY_S
    return Decision(
        allowed=refused is None,
        refused_by=refused,
        retry_after_s=retry,
        limit_requests=rpm,
        remaining_requests=max(0, math.floor(requests)) if rpm is not None else 0,
        reset_requests_s=(rpm - requests) * 60.0 / rpm if rpm is not None else 0.0,
        limit_tokens=tpm,
        remaining_tokens=max(0, math.floor(tokens)) if tpm is not None else 0,
        reset_tokens_s=(tpm - tokens) * 60.0 / tpm if tpm is not None else 0.0,
    )


_LIMITS: dict[str, Limit] = {
    "requests": "requests", "tokens": "tokens", "concurrent_responses": "concurrent_responses", "connections": "connections"
}


class MemoryRateLimiter:
    """The counters in this process (one server process, or limits per process).

    Buckets of at most ``max_tenants`` tenants are kept (least recently used go: a dropped bucket
    starts full again); running responses and open connections are counted exactly."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_tenants: int = 1_000_000) -> None:
        self.clock = clock
        self._buckets: LRUCache[str, _Bucket] = LRUCache(maxsize=max_tenants)
        self._running: dict[str, int] = {}
        self._connections: dict[str, int] = {}

    def _bucket(self, tenant: str, quota: Quota) -> _Bucket:
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(quota, now)
        else:
            bucket.refill(quota, now)
        return bucket

    async def admit(self, tenant: str, quota: Quota, lease: str) -> Decision:
        return self.admit_now(tenant, quota)

    def admit_now(self, tenant: str, quota: Quota) -> Decision:
        """:meth:`admit`, without the coroutine (the in-process limiter never waits)."""
        bucket = self._bucket(tenant, quota)
        running = self._running.get(tenant, 0)
        decision = decide(quota, bucket.requests, bucket.tokens, running, count=True)
        if decision.allowed:
            if quota.requests_per_minute is not None:
                bucket.requests -= 1.0
            self._running[tenant] = running + 1
        return decision

    def finish(self, tenant: str, quota: Quota, lease: str, tokens: int) -> None:
        if quota.tokens_per_minute is not None and tokens:
            self._bucket(tenant, quota).tokens -= tokens
        running = self._running.get(tenant, 0) - 1
        if running > 0:
            self._running[tenant] = running
        else:
            self._running.pop(tenant, None)

    async def connect(self, tenant: str, quota: Quota, lease: str) -> Decision:
        open_now = self._connections.get(tenant, 0)
        if quota.connections is not None and open_now >= quota.connections:
            return Decision(False, "connections", CONCURRENCY_RETRY_S)
        self._connections[tenant] = open_now + 1
        return ALLOWED

    def disconnect(self, tenant: str, quota: Quota, lease: str) -> None:
        left = self._connections.get(tenant, 0) - 1
        if left > 0:
            self._connections[tenant] = left
        else:
            self._connections.pop(tenant, None)

    async def peek(self, tenant: str, quota: Quota) -> Decision:
        bucket = self._bucket(tenant, quota)
        return decide(quota, bucket.requests, bucket.tokens, self._running.get(tenant, 0), count=False)

    def running(self, tenant: str) -> int:
        """Responses of ``tenant`` holding a slot now."""
        return self._running.get(tenant, 0)

    def connections(self, tenant: str) -> int:
        return self._connections.get(tenant, 0)


class Admission:
    """One admitted request: :meth:`release` (once; later calls do nothing) charges what it used."""

    __slots__ = ("_limiter", "decision", "lease", "quota", "released", "tenant")

    def __init__(self, limiter: RateLimiter | None, tenant: str, quota: Quota, lease: str, decision: Decision) -> None:
        self._limiter = limiter
        self.tenant = tenant
        self.quota = quota
        self.lease = lease
        self.decision = decision
        self.released = False

    def release(self, tokens: int = 0) -> None:
        if self.released:
            return
        self.released = True
        if self._limiter is not None:
            self._limiter.finish(self.tenant, self.quota, self.lease, tokens)


class Quotas:
    """The quota stage: each tenant's :class:`Quota` applied with one :class:`RateLimiter`.

    Tenants without limits cost nothing (no limiter call, no headers)."""

    def __init__(self, config: QuotaConfig, limiter: RateLimiter | None = None) -> None:
        self.config = config
        self.limiter: RateLimiter = limiter if limiter is not None else MemoryRateLimiter()

    def quota(self, tenant: str) -> Quota:
        return self.config.of(tenant)

    async def admit(self, tenant: str, lease: str) -> Admission:
        """Admit one request of ``tenant`` (``lease``: its response id), or raise
        :class:`QuotaExceeded` (429)."""
        quota = self.config.of(tenant)
        if quota.unlimited or (
            quota.requests_per_minute is None and quota.tokens_per_minute is None and quota.concurrent_responses is None
        ):
            return Admission(None, tenant, quota, lease, ALLOWED)
        limiter = self.limiter
        if isinstance(limiter, MemoryRateLimiter):
            decision = limiter.admit_now(tenant, quota)  # no coroutine on the in-process path
        else:
            decision = await limiter.admit(tenant, quota, lease)
        if not decision.allowed:
            raise QuotaExceeded(decision, quota)
        return Admission(limiter, tenant, quota, lease, decision)

    async def status(self, tenant: str) -> Decision:
        """Where ``tenant`` stands (for the headers of answers that count nothing)."""
        quota = self.config.of(tenant)
        if quota.requests_per_minute is None and quota.tokens_per_minute is None:
            return ALLOWED
        return await self.limiter.peek(tenant, quota)

    async def connect(self, tenant: str, lease: str) -> None:
        """Hold a connection slot, or raise :class:`QuotaExceeded`."""
        quota = self.config.of(tenant)
        if quota.connections is None:
            return
        decision = await self.limiter.connect(tenant, quota, lease)
        if not decision.allowed:
            raise QuotaExceeded(decision, quota)

    def disconnect(self, tenant: str, lease: str) -> None:
        quota = self.config.of(tenant)
        if quota.connections is not None:
            self.limiter.disconnect(tenant, quota, lease)

    async def aclose(self) -> None:
        close = getattr(self.limiter, "aclose", None)
        if close is not None:
            await close()

    async def start(self) -> None:
        start = getattr(self.limiter, "start", None)
        if start is not None:
            await start()


def rate_limit_headers(decision: Decision) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers for ``decision`` (and ``retry-after`` when refused)."""
    headers: dict[str, str] = {}
    if decision.limit_requests is not None:
        headers["x-ratelimit-limit-requests"] = str(decision.limit_requests)
        headers["x-ratelimit-remaining-requests"] = str(decision.remaining_requests)
        headers["x-ratelimit-reset-requests"] = format_duration(decision.reset_requests_s)
    if decision.limit_tokens is not None:
        headers["x-ratelimit-limit-tokens"] = str(decision.limit_tokens)
        headers["x-ratelimit-remaining-tokens"] = str(decision.remaining_tokens)
        headers["x-ratelimit-reset-tokens"] = format_duration(decision.reset_tokens_s)
    if not decision.allowed:
        headers["retry-after"] = str(max(1, math.ceil(decision.retry_after_s)))
        headers["retry-after-ms"] = str(max(1, math.ceil(decision.retry_after_s * 1000)))
    return headers
