"""The benchmark server process: ``python -m benchmarks.suite.runner SPEC_JSON``.

Serves :func:`responses_cache.create_app` on the simulated engine (configured by the spec) on a
free loopback port, prints ``PORT <n>`` once listening, and adds a few ``/_bench/*`` routes that
the benchmark reads from outside — nothing in the server code itself changes:

* ``GET /_bench/stats[?footprint=1]`` — RSS, engine counters, and (optionally) the cache
  footprint from :func:`.footprint.cache_footprint`;
* ``POST /_bench/profile/start`` and ``POST /_bench/profile/stop?path=P&top=N`` — cProfile the
  event-loop thread over a phase; returns the top functions and writes the stats to ``P``;
* ``POST /_bench/tracemalloc/mark`` and ``GET /_bench/tracemalloc?top=N`` — allocation sites of
  the memory added since the mark (only when the spec enables tracemalloc).
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import resource
import socket
import sys
import tracemalloc
from dataclasses import asdict, dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """What the benchmark server runs: the engine's timing and scenario, renderer and tenants."""

    instant: bool = True
    output_tokens_per_s: float = 1_000.0
    prefill_tokens_per_s: float = 20_000.0
    answer_tokens: int = 24
    #: ``{"tool_calls": .., "argument_tokens": .., "answer_tokens": ..}`` or ``None``.
    scenario: dict[str, int] | None = None
    renderer: str | None = "harmony"
    #: API key → tenant; ``None`` accepts everything as one tenant.
    api_keys: dict[str, str] | None = None
    context_window: int = 131_072
    tracemalloc: bool = False
    #: ``redis://...`` for a shared store (``None``: the in-process memory store).
    store: str | None = None
    store_snapshots: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServerSpec:
        return cls(**json.loads(text))


def build_app(spec: ServerSpec) -> Any:
    from responses_cache.backends.simulated import Scenario, SimulatedConfig, SimulatedEngine
    from responses_cache.edge.app import ServerConfig, create_app

    engine = SimulatedEngine(
        SimulatedConfig(
            instant=spec.instant,
            output_tokens_per_s=spec.output_tokens_per_s,
            prefill_tokens_per_s=spec.prefill_tokens_per_s,
            answer_tokens=spec.answer_tokens,
            scenario=Scenario(**spec.scenario) if spec.scenario is not None else None,
        )
    )
    store = None
    if spec.store is not None:
        from responses_cache.storage.redis_store import RedisResponseStore

        store = RedisResponseStore(spec.store, snapshots=spec.store_snapshots)
    app = create_app(
        ServerConfig(
            backend=engine,
            renderer=spec.renderer,
            api_keys=spec.api_keys,
            context_window=spec.context_window,
            store=store,
            own_store=True,
        )
    )
    app.router.routes.extend(_Debug(engine, app.state.metrics).routes())
    return app


class _Debug:
    def __init__(self, engine: Any, metrics: Any) -> None:
        self.engine = engine
        self.metrics = metrics
        self.profile: cProfile.Profile | None = None
        self.mark: tracemalloc.Snapshot | None = None

    def routes(self) -> list[Route]:
        return [
            Route("/_bench/stats", self.stats, methods=["GET"]),
            Route("/_bench/profile/start", self.profile_start, methods=["POST"]),
            Route("/_bench/profile/stop", self.profile_stop, methods=["POST"]),
            Route("/_bench/tracemalloc/mark", self.trace_mark, methods=["POST"]),
            Route("/_bench/tracemalloc", self.trace_diff, methods=["GET"]),
        ]

    async def stats(self, request: Request) -> JSONResponse:
        from .footprint import cache_footprint, rss_bytes

        body: dict[str, Any] = {
            "rss": rss_bytes(),
            "engine": {
                "requests": self.engine.requests,
                "prefilled_tokens": self.engine.prefilled_tokens,
            },
            "counters": {_name(k): v for k, v in getattr(self.metrics, "counters", {}).items()},
            "summaries": {
                _name(k): list(v) for k, v in getattr(self.metrics, "summaries", {}).items()
            },
        }
        if request.query_params.get("footprint"):
            body["footprint"] = cache_footprint()
            body["rss"] = rss_bytes()
        return JSONResponse(body)

    async def profile_start(self, request: Request) -> JSONResponse:
        self.profile = cProfile.Profile()
        self.profile.enable()
        return JSONResponse({"ok": True})

    async def profile_stop(self, request: Request) -> JSONResponse:
        if self.profile is None:
            return JSONResponse({"error": "not profiling"}, status_code=409)
        self.profile.disable()
        profile, self.profile = self.profile, None
        path = request.query_params.get("path")
        if path:
            profile.dump_stats(path)
        top = int(request.query_params.get("top", "25"))
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
        return JSONResponse({"text": out.getvalue()})

    async def trace_mark(self, request: Request) -> JSONResponse:
        if not tracemalloc.is_tracing():
            return JSONResponse({"error": "tracemalloc is off"}, status_code=409)
        self.mark = tracemalloc.take_snapshot()
        return JSONResponse({"ok": True})

    async def trace_diff(self, request: Request) -> JSONResponse:
        if not tracemalloc.is_tracing() or self.mark is None:
            return JSONResponse({"error": "no mark"}, status_code=409)
        top = int(request.query_params.get("top", "15"))
        snapshot = tracemalloc.take_snapshot()
        diff = snapshot.compare_to(self.mark, "lineno")
        sites = [
            {"site": str(d.traceback[0]), "bytes": d.size_diff, "count": d.count_diff}
            for d in sorted(diff, key=lambda d: -d.size_diff)[:top]
        ]
        return JSONResponse({"sites": sites, "traced": tracemalloc.get_traced_memory()[0]})


def _name(key: tuple[str, tuple[tuple[str, str], ...]]) -> str:
    """``name{label=value,...}`` for an :class:`~responses_cache.observability.metrics.InMemoryMetrics` key."""
    name, labels = key
    return name + ("{" + ",".join(f"{k}={v}" for k, v in labels) + "}" if labels else "")


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft open-files limit towards ``wanted`` (up to the hard limit); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return int(soft)


def serve(spec: ServerSpec) -> None:
    import uvicorn

    raise_fd_limit(65_536)
    if spec.tracemalloc:
        tracemalloc.start()
    app = build_app(spec)
    # proto must be IPPROTO_TCP: asyncio only sets TCP_NODELAY on such sockets (else Nagle adds ~40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        log_level="warning",
        ws_max_size=64 * 1024 * 1024,
        ws_ping_interval=None,
        backlog=4096,
        timeout_keep_alive=60,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


def main(argv: list[str]) -> int:
    serve(ServerSpec.from_json(argv[0]) if argv else ServerSpec())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
