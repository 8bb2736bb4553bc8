"""The ``responses-cache`` command: ``serve``. (The benchmark suite runs from a source checkout:
``python -m benchmarks.suite``.)"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..billing import Biller
    from ..edge.app import ServerConfig
    from ..limits.input_rate import InputRateLimits
    from ..limits.quotas import QuotaConfig, RateLimiter
    from ..observability.metrics import Metrics
    from ..observability.tracing import Tracer
    from ..storage.store import ResponseStore
    from .serving import ConnectionLimits
    from .settings import ServeSettings


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401  # the server extra is installed
    except ImportError:
        print("responses-cache: serve needs the server extra: pip install 'responses-cache[server]'", file=sys.stderr)
        return 2

    from ..edge.app import create_app
    from ..tokens.errors import VocabularyError
    from .allocator import return_large_blocks
    from .collector import freeze_startup_objects
    from .serving import DrainingServer, uvicorn_config
    from .settings import SettingsError, load_settings

    overrides = {name: getattr(args, name, None) for name in _OPTIONS}
    overrides["api_keys"] = args.api_key
    try:
        settings = load_settings(file=args.config, env=os.environ, overrides=overrides)
        config = server_config(settings)
        app = create_app(config)  # the renderer and its model files are loaded here
    except (SettingsError, LookupError, TypeError, ValueError, ImportError, OSError, VocabularyError) as exc:
        # One line, no traceback: a setting that cannot work stops the start.
        print(f"responses-cache: {exc}", file=sys.stderr)
        return 2
    if config.sealer is not None and settings.sealing_key is None:
        print(
            "responses-cache: warning: no sealing_key: this process seals with a key of its own, so compaction "
            "items and encrypted reasoning it hands out do not survive a restart (set RESPONSES_CACHE_SEALING_KEY)",
            file=sys.stderr, flush=True,
        )
    if settings.log_json:
        from ..observability.logs import use_json_logs

        use_json_logs()  # INFO: the line per turn
    elif settings.log_level in _VERBOSE:
        from ..observability.logs import use_text_logs

        use_text_logs(_VERBOSE[settings.log_level])  # the package's own records too, not uvicorn's alone
    return_large_blocks()  # what a megabyte input allocates goes back to the system once freed
    host, port = settings.host, settings.port
    print(f"responses-cache: serving {settings.backend} on http://{host}:{port}/v1 (WebSocket: ws://{host}:{port}/v1/responses)", flush=True)
    server = uvicorn_config(
        app, host=host, port=port, limits=connection_limits(settings), log_level=settings.log_level,
        ws_max_size=settings.max_body_bytes,
    )
    freeze_startup_objects()  # what start-up built is never walked by the garbage collector again
    DrainingServer(server, app.state.service, settings.drain_timeout_s).run()
    return 0


#: ``log_level`` values under WARNING, as :mod:`logging` levels (uvicorn's ``trace`` is 5).
_VERBOSE = {"info": logging.INFO, "debug": logging.DEBUG, "trace": 5}


def server_config(settings: ServeSettings) -> ServerConfig:
    """The server the settings describe: its backend, billing, store, quotas and observability
    built. Raises ``LookupError``, ``TypeError``, ``ValueError``, ``ImportError`` or ``OSError``
    for a setting that cannot be used."""
    from ..backends import load_backend
    from ..edge.app import ServerConfig
    from ..session.session import SessionConfig
    from .settings import SESSION_SETTINGS

    options: dict[str, object] = dict(settings.backend_options)
    if settings.backend == "simulated":
        options.setdefault("instant", settings.instant)
    elif settings.instant:
        raise ValueError("--instant applies to the simulated backend only")
    if settings.engine_slots is not None and settings.engine_slots < 1:
        raise ValueError(f"engine_slots must be at least 1, not {settings.engine_slots}")
    quotas = _quotas(settings)
    metrics, tracer = _observability(settings)
    return ServerConfig(
        backend=load_backend(settings.backend, **options),
        api_keys=settings.api_keys or None,
        renderer=settings.renderer or None,
        renderer_options=settings.renderer_options,
        billing=_biller(settings),
        metrics=metrics,
        tracer=tracer,
        session=SessionConfig(**{name: getattr(settings, name) for name in SESSION_SETTINGS}),
        max_body_bytes=settings.max_body_bytes,
        process_cache_bytes=settings.process_cache_bytes,
        hot_cache_bytes=settings.hot_cache_bytes,
        context_window=settings.context_window,
        store=_store(settings),
        store_max_bytes=settings.store_max_bytes,
        store_max_tenant_bytes=settings.store_max_tenant_bytes,
        own_store=True,
        process_input_bytes=settings.process_input_bytes,
        write_timeout_s=settings.write_timeout_s,
        input_rate=input_rate_limits(settings),
        outbound_bytes=settings.outbound_bytes,
        tool_cache_bytes=settings.tool_cache_bytes,
        partition_prefix_cache=settings.partition_prefix_cache,
        truncation_headroom=settings.truncation_headroom,
        compaction_ttl_s=settings.compaction_ttl_s,
        compaction_max_output_tokens=settings.compaction_max_output_tokens,
        sealer=_sealer(settings.sealing_key, shared_store=_shares_store(settings)),
        quotas=quotas,
        rate_limiter=_rate_limiter(settings) if quotas is not None else None,
        engine_slots=settings.engine_slots,
    )


def _observability(settings: ServeSettings) -> tuple[Metrics | None, Tracer | None]:
    """Prometheus metrics (``prometheus``), and OpenTelemetry traces and metrics (``otel``:
    the SDK configured from the ``OTEL_*`` environment) beside them."""
    metrics: Metrics | None = None
    if settings.prometheus:
        from ..observability.metrics import PrometheusMetrics

        metrics = PrometheusMetrics()
    if not settings.otel:
        return metrics, None
    from ..observability.metrics import MetricsTee
    from ..observability.otel import (
        OpenTelemetryMetrics,
        OpenTelemetryTracer,
        configure_from_environment,
    )

    configure_from_environment()
    otel_metrics = OpenTelemetryMetrics()
    return (MetricsTee(metrics, otel_metrics) if metrics is not None else otel_metrics), OpenTelemetryTracer()


def connection_limits(settings: ServeSettings) -> ConnectionLimits:
    """uvicorn's per-connection limits the settings give."""
    from .serving import ConnectionLimits

    return ConnectionLimits(
        header_timeout_s=settings.header_timeout_s,
        keep_alive_s=settings.keep_alive_s,
        max_connections=settings.max_connections,
        ws_ping_interval_s=settings.ws_ping_interval_s,
        ws_ping_timeout_s=settings.ws_ping_timeout_s,
        ws_linger_s=settings.write_timeout_s,
    )


def input_rate_limits(settings: ServeSettings) -> InputRateLimits:
    """The input rate limits the settings give (a rate of 0: that limit off)."""
    from ..limits.input_rate import InputRateLimits

    return InputRateLimits(
        connection_bytes_per_s=settings.input_bytes_per_s or None,
        connection_burst_bytes=settings.input_burst_bytes,
        tenant_bytes_per_s=settings.tenant_input_bytes_per_s or None,
        tenant_burst_bytes=settings.tenant_input_burst_bytes,
    )


def _shares_store(settings: ServeSettings) -> bool:
    """The ``store`` is a Redis one, shared with other processes."""
    if settings.store in ("", "memory"):
        return False  # without importing the Redis client (half a second of a server's start)
    from ..storage.redis_client import SCHEMES, scheme_of

    return scheme_of(settings.store) in SCHEMES


def _sealer(key: str | None, *, shared_store: bool = False) -> Any:
    """The sealer of the ``sealing_key`` setting (compaction items, encrypted reasoning). Without
    one: refused with a shared store (another process could not open what this one seals), else a
    key of this process's own (``None`` without the sealing extra: those features stay off)."""
    from ..conversation.sealing import Sealer, new_key

    if key is None:
        if shared_store:
            raise ValueError(
                "sealing_key: processes sharing a Redis store need one sealing key between them: set "
                "RESPONSES_CACHE_SEALING_KEY (32 random bytes in base64) to the same value in every process"
            )
        try:
            return Sealer.from_text(new_key())
        except ImportError:
            return None

    try:
        return Sealer.from_text(key)
    except ValueError:
        raise ValueError("sealing_key: expected 32 random bytes in base64 (the key itself is not shown)") from None


def _quotas(settings: ServeSettings) -> QuotaConfig | None:
    """The ``quotas`` setting as a :class:`QuotaConfig` (``None`` when it is empty): entries named
    by one of ``api_keys`` apply to that key's tenant, ``"*"`` to every tenant without its own."""
    if not settings.quotas:
        return None
    import msgspec

    from ..core.auth import tenant_of_key
    from ..limits.quotas import UNLIMITED, Quota, QuotaConfig

    keys = set(settings.api_keys)
    default, tenants = UNLIMITED, {}
    for name, entry in settings.quotas.items():
        quota = Quota(**msgspec.structs.asdict(entry))
        if name == "*":
            default = quota
        else:
            tenants[tenant_of_key(name) if name in keys else name] = quota
    return QuotaConfig(default, tenants)


def _rate_limiter(settings: ServeSettings) -> RateLimiter | None:
    """The quota counters: in Redis with a Redis ``store`` (shared by every process), else here."""
    from ..storage.redis_client import SCHEMES, scheme_of

    if scheme_of(settings.store) not in SCHEMES:
        return None
    from ..limits.redis_quotas import RedisRateLimiter

    lease = settings.lifetime_s + settings.lifetime_grace_s + 60.0
    return RedisRateLimiter(settings.store, connection_lease_s=lease)


def _store(settings: ServeSettings) -> ResponseStore | None:
    """``None`` for the default in-process store, else the shared store the URL names."""
    url = settings.store
    if url in ("", "memory"):
        return None
    from ..storage.redis_client import SCHEMES, scheme_of

    if scheme_of(url) in SCHEMES:
        from ..storage.redis_store import RedisResponseStore

        return RedisResponseStore(url, ttl_s=settings.store_ttl_s, snapshots=settings.store_snapshots)
    raise ValueError(
        f"unsupported store {url!r}: use 'memory' or a Redis URL "
        "(redis://, rediss://, unix://, redis+sentinel://, redis+cluster://, rediss+cluster://)"
    )


def _biller(settings: ServeSettings) -> Biller | None:
    from ..billing import Biller, JsonlSink, SqliteSink, UsageJournal, WebhookSink

    chosen = [
        (kind, value)
        for kind, value in (
            ("jsonl", settings.billing_jsonl), ("sqlite", settings.billing_sqlite), ("webhook", settings.billing_webhook)
        )
        if value
    ]
    if not chosen:
        if settings.billing_journal:
            raise ValueError(
                "billing_journal needs a sink to deliver to: add billing_jsonl, billing_sqlite or billing_webhook"
            )
        return None
    if len(chosen) > 1:
        raise ValueError("choose one of billing_jsonl, billing_sqlite, billing_webhook")
    kind, value = chosen[0]
    if settings.billing_journal:
        UsageJournal.probe(settings.billing_journal)  # a second server on one journal fails here
    sink = JsonlSink(value) if kind == "jsonl" else SqliteSink(value) if kind == "sqlite" else WebhookSink(value)
    return Biller(
        sink,
        journal_path=settings.billing_journal,
        durability=settings.billing_durability,
        stop_timeout=settings.billing_stop_timeout,
        flush_interval=settings.billing_flush_interval,
        queue_size=settings.billing_queue_size,
    )


#: Settings that have a command-line option of the same name.
_OPTIONS = (
    "backend", "host", "port", "instant", "renderer", "log_level", "prometheus", "otel", "log_json",
    "billing_jsonl", "billing_sqlite", "billing_webhook", "billing_journal", "billing_durability",
    "billing_stop_timeout", "billing_flush_interval", "billing_queue_size", "lifetime_s", "store",
    "store_max_bytes", "store_max_tenant_bytes",
    "hot_cache_bytes", "engine_slots", "drain_timeout_s",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="responses-cache", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the reference Responses server (HTTP, SSE and WebSocket mode)")
    serve.add_argument("--config", metavar="FILE", help="settings file (TOML or JSON); see docs/configuration.md")
    serve.add_argument("--backend", help="simulated (default), or an installed adapter")
    serve.add_argument("--host", help="default 127.0.0.1")
    serve.add_argument("--port", type=int, help="default 8000")
    serve.add_argument("--api-key", action="append", help="accepted bearer key (repeatable; env RESPONSES_CACHE_API_KEY)")
    serve.add_argument("--instant", action="store_true", default=None, help="simulated engine with zero latency")
    serve.add_argument("--renderer", help="prompt renderer: harmony (default), chatml, hf:<model dir> (the model's own tokenizer and chat template), gguf:<file> (a GGUF's, for llama.cpp), or '' for none")
    serve.add_argument("--log-level", help="default warning")
    serve.add_argument("--prometheus", action="store_true", default=None, help="export metrics at GET /metrics (prometheus extra)")
    serve.add_argument(
        "--otel", action="store_true", default=None,
        help="OpenTelemetry traces and metrics (otel extra; OTLP from OTEL_* variables when nothing else configures it)",
    )
    serve.add_argument(
        "--log-json", action="store_true", default=None,
        help="JSON log lines on stderr: one per turn and per error, with trace and response ids",
    )
    serve.add_argument("--lifetime-s", type=float, help="WebSocket connection lifetime, seconds (default 3600)")
    serve.add_argument("--billing-jsonl", metavar="PATH", help="write usage records to a JSONL file")
    serve.add_argument("--billing-sqlite", metavar="PATH", help="write usage records to a SQLite database")
    serve.add_argument("--billing-webhook", metavar="URL", help="POST usage records to a webhook (needs the webhook extra)")
    serve.add_argument(
        "--billing-journal", metavar="PATH",
        help="write-ahead usage journal (needs a sink; replayed at start; one per server process)",
    )
    serve.add_argument(
        "--billing-durability", choices=("process", "machine"),
        help="journal durability: process (default; survives kill -9) or machine (fdatasync; survives power loss)",
    )
    serve.add_argument("--billing-stop-timeout", type=float, metavar="S", help="how long shutdown waits for the sink (default 3)")
    serve.add_argument(
        "--billing-flush-interval", type=float, metavar="S", help="how long a partial batch waits for the sink (default 0.05)"
    )
    serve.add_argument(
        "--billing-queue-size", type=int, metavar="N", help="journaled records kept in memory for delivery (default 10000)"
    )
    serve.add_argument(
        "--store", metavar="URL", help="memory (default: this process only) or a Redis URL (shared; redis extra): "
        "redis[s]://[USER:PASSWORD@]HOST:PORT/DB, redis+sentinel://HOST:PORT[,…]/NAME[/DB], "
        "redis[s]+cluster://HOST:PORT[,…]"
    )
    serve.add_argument(
        "--store-max-bytes", type=int, metavar="N", help="bytes the memory store keeps, all tenants together (default 1 GiB)"
    )
    serve.add_argument(
        "--store-max-tenant-bytes", type=int, metavar="N", help="bytes the memory store keeps of one tenant (default 256 MiB)"
    )
    serve.add_argument("--hot-cache-bytes", type=int, help="the process-wide hot cache's share of the cache budget")
    serve.add_argument(
        "--engine-slots", type=int, metavar="N",
        help="generations running at once; waiting turns get freed slots round-robin across tenants",
    )
    serve.add_argument(
        "--drain-timeout-s", type=float, metavar="S",
        help="on SIGTERM, how long running turns may take to finish before they are cut (default 30)",
    )
    serve.set_defaults(func=_serve)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
