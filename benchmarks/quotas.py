"""Per-tenant quotas: how exactly the token rate is held, and what a turn pays for the check.

Three measurements, in one run:

* **rate accuracy** — 1,000 tenants x 4 connections, each connection running turns back to back
  (prompt + output of 500-3,500 tokens, generated at 2,000 tokens/s), every tenant limited to
  ``--tpm`` tokens per minute, far below what its connections would use. A refused turn retries
  after its ``Retry-After``. The quota stage and the in-process counters are the real ones; the
  clock is simulated (``--seconds`` of it), so the run takes seconds and the result does not
  depend on the machine's load. Tokens are counted when turns end, over the window after the
  first minute (the initial burst), per tenant and in total, against ``tpm / 60`` per second.
* **overhead per turn, in-process** — ``Quotas.admit`` + ``Admission.release`` (what the edges
  add to a turn), over the 1,000 tenants, in real time; and a whole HTTP turn (instant simulated
  engine, in-process ASGI) with and without quotas, side by side.
* **Redis** (``--redis URL``, or a private ``redis-server`` it starts with ``--redis start``) —
  round trips per turn and the time of the admission, with the counters in Redis.

    python -m benchmarks.quotas
    python -m benchmarks.quotas --tenants 1000 --connections 4 --seconds 1800 --redis start
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import random
import statistics
import time
from typing import Any

from responses_cache.limits.quotas import MemoryRateLimiter, Quota, QuotaConfig, Quotas


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def rate_accuracy(tenants: int, connections: int, tpm: int, seconds: float, seed: int) -> dict[str, Any]:
    clock = Clock()
    quotas = Quotas(QuotaConfig(Quota(tokens_per_minute=tpm)), MemoryRateLimiter(clock=clock))
    rng = random.Random(seed)
    warm = 60.0
    charged = [0] * tenants
    # (time, tie-break, connection, admission or None, tokens)
    events: list[tuple[float, int, int, Any, int]] = []
    seq = 0
    for conn in range(tenants * connections):
        heapq.heappush(events, (rng.random(), seq, conn, None, 0))
        seq += 1
    turns = refusals = 0
    while events:
        at, _, conn, admission, tokens = heapq.heappop(events)
        if at > seconds:
            break
        clock.now = at
        tenant = conn // connections
        if admission is not None:
            admission.release(tokens)
            if at >= warm:
                charged[tenant] += tokens
        try:
            admission = await quotas.admit(f"t{tenant}", "")
        except Exception as exc:  # QuotaExceeded: retry when it says
            refusals += 1
            seq += 1
            heapq.heappush(events, (at + exc.decision.retry_after_s, seq, conn, None, 0))  # type: ignore[attr-defined]
            continue
        turns += 1
        tokens = rng.randint(500, 3500)
        seq += 1
        heapq.heappush(events, (at + tokens / 2000.0, seq, conn, admission, tokens))
    window = seconds - warm
    target = tpm / 60.0 * window
    errors = [abs(c - target) / target for c in charged]
    return {
        "tenants": tenants,
        "connections": connections,
        "tpm": tpm,
        "simulated_s": seconds,
        "turns": turns,
        "refusals": refusals,
        "total_error_pct": 100 * abs(sum(charged) - target * tenants) / (target * tenants),
        "tenant_error_pct_p50": 100 * statistics.median(errors),
        "tenant_error_pct_max": 100 * max(errors),
    }


async def stage_overhead(tenants: int, turns: int) -> dict[str, float]:
    """Real time of admit + release per turn over ``tenants`` tenants (best of 5 runs)."""
    quotas = Quotas(
        QuotaConfig(Quota(requests_per_minute=10**9, tokens_per_minute=10**12, concurrent_responses=100)),
        MemoryRateLimiter(),
    )
    names = [f"t{i}" for i in range(tenants)]
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for n in range(turns):
            admission = await quotas.admit(names[n % tenants], "")
            admission.release(1000)
        best = min(best, (time.perf_counter() - start) / turns)
    return {"admit_release_us": best * 1e6}


async def http_turns(turns: int, repeats: int) -> dict[str, float]:
    """A whole HTTP turn in-process with and without quotas, interleaved runs: medians."""
    import httpx

    from responses_cache import SimulatedConfig, SimulatedEngine, create_app

    def app(limited: bool) -> Any:
        quotas = QuotaConfig(Quota(requests_per_minute=10**9, tokens_per_minute=10**12, concurrent_responses=100))
        return create_app(
            backend=SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=20)), quotas=quotas if limited else None
        )

    apps = {"without": app(False), "with": app(True)}
    times: dict[str, list[float]] = {"without": [], "with": []}
    body = {"model": "sim-1", "input": "hello there", "store": False}
    for _ in range(repeats):
        for name, target in apps.items():
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=target), base_url="http://t/v1") as client:
                await client.post("/responses", json=body)  # warm
                start = time.perf_counter()
                for _ in range(turns):
                    await client.post("/responses", json=body)
                times[name].append((time.perf_counter() - start) / turns)
    without, with_ = statistics.median(times["without"]), statistics.median(times["with"])
    return {"turn_ms_without": without * 1e3, "turn_ms_with": with_ * 1e3, "difference_ms": (with_ - without) * 1e3}


async def redis_turns(url: str, tenants: int, turns: int) -> dict[str, float]:
    from responses_cache.limits.redis_quotas import RedisRateLimiter

    limiter = RedisRateLimiter(url, flush_s=0.05)
    quotas = Quotas(
        QuotaConfig(Quota(requests_per_minute=10**9, tokens_per_minute=10**12, concurrent_responses=100)), limiter
    )
    try:
        for n in range(tenants):  # scripts loaded, connections made
            (await quotas.admit(f"w{n}", "lease")).release(1)
        await limiter.flush()
        before = limiter.round_trips
        start = time.perf_counter()
        for n in range(turns):
            admission = await quotas.admit(f"t{n % tenants}", f"r{n}")
            admission.release(1000)
        elapsed = time.perf_counter() - start
        await limiter.flush()
        trips = limiter.round_trips - before
    finally:
        await limiter.aclose()
    return {"round_trips_per_turn": trips / turns, "admit_release_ms": elapsed / turns * 1e3}


async def run(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    accuracy = await rate_accuracy(args.tenants, args.connections, args.tpm, args.seconds, args.seed)
    print(
        f"rate accuracy: {accuracy['tenants']} tenants x {accuracy['connections']} connections, "
        f"{accuracy['tpm']} tokens/min each, {accuracy['simulated_s']:.0f} s simulated "
        f"({accuracy['turns']} turns, {accuracy['refusals']} refusals; {time.perf_counter() - started:.1f} s real)"
    )
    print(
        f"  tokens counted vs configured: total {accuracy['total_error_pct']:.3f}% off; "
        f"per tenant p50 {accuracy['tenant_error_pct_p50']:.3f}%, max {accuracy['tenant_error_pct_max']:.3f}%"
    )
    stage = await stage_overhead(args.tenants, 200_000)
    print(f"quota stage per turn (admit + release, in-process): {stage['admit_release_us']:.2f} us")
    http = await http_turns(args.http_turns, args.repeats)
    print(
        f"HTTP turn in-process: {http['turn_ms_without']:.3f} ms without quotas, {http['turn_ms_with']:.3f} ms with "
        f"(difference {http['difference_ms']:+.3f} ms, medians of {args.repeats} interleaved runs)"
    )
    if args.redis:
        if args.redis == "start":
            from benchmarks.suite.redisproc import RedisProcess

            with RedisProcess() as server:
                redis = await redis_turns(server.url + "/0", args.tenants, 20_000)
        else:
            redis = await redis_turns(args.redis, args.tenants, 20_000)
        print(
            f"Redis counters: {redis['round_trips_per_turn']:.3f} round trips per turn, "
            f"{redis['admit_release_ms']:.3f} ms per turn (admit + release)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--tpm", type=int, default=60_000)
    parser.add_argument("--seconds", type=float, default=1800.0, help="simulated seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--http-turns", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--redis", help="redis://HOST:PORT/DB, or 'start' for a private redis-server")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
