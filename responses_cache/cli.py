"""The ``responses-cache`` command: ``serve`` (and ``bench``, see :mod:`responses_cache.bench`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .billing import Biller
    from .settings import ServeSettings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import ServerConfig, create_app
    from .backends import load_backend
    from .serving import ConnectionLimits, uvicorn_config
    from .session import SessionConfig
    from .settings import SettingsError, load_settings

    overrides = {name: getattr(args, name, None) for name in _OPTIONS}
    overrides["api_keys"] = args.api_key
    try:
        settings = load_settings(file=args.config, env=os.environ, overrides=overrides)
    except SettingsError as exc:
        print(f"responses-cache: {exc}", file=sys.stderr)
        return 2
    options: dict[str, object] = dict(settings.backend_options)
    if settings.backend == "simulated":
        options.setdefault("instant", settings.instant)
    elif settings.instant:
        print("responses-cache: --instant applies to the simulated backend only", file=sys.stderr)
        return 2
    try:
        backend = load_backend(settings.backend, **options)
        billing = _biller(settings)
    except (LookupError, TypeError, ValueError) as exc:
        print(f"responses-cache: {exc}", file=sys.stderr)
        return 2
    metrics = None
    if settings.prometheus:
        from .metrics import PrometheusMetrics

        metrics = PrometheusMetrics()
    config = ServerConfig(
        backend=backend,
        api_keys=settings.api_keys or None,
        renderer=settings.renderer or None,
        billing=billing,
        metrics=metrics,
        session=SessionConfig(lifetime_s=settings.lifetime_s),
        max_body_bytes=settings.max_body_bytes,
        process_cache_bytes=settings.process_cache_bytes,
        context_window=settings.context_window,
        process_input_bytes=settings.process_input_bytes,
        write_timeout_s=settings.write_timeout_s,
        tool_cache_bytes=settings.tool_cache_bytes,
        partition_prefix_cache=settings.partition_prefix_cache,
    )
    limits = ConnectionLimits(
        header_timeout_s=settings.header_timeout_s,
        keep_alive_s=settings.keep_alive_s,
        max_connections=settings.max_connections,
        ws_ping_interval_s=settings.ws_ping_interval_s,
        ws_ping_timeout_s=settings.ws_ping_timeout_s,
        ws_linger_s=settings.write_timeout_s,
    )
    app = create_app(config)
    host, port = settings.host, settings.port
    print(f"responses-cache: serving {settings.backend} on http://{host}:{port}/v1 (WebSocket: ws://{host}:{port}/v1/responses)", flush=True)
    server = uvicorn_config(
        app, host=host, port=port, limits=limits, log_level=settings.log_level, ws_max_size=settings.max_body_bytes
    )
    uvicorn.Server(server).run()
    return 0


def _biller(settings: ServeSettings) -> Biller | None:
    from .billing import Biller, JsonlSink, SqliteSink, WebhookSink

    chosen = [
        (kind, value)
        for kind, value in (
            ("jsonl", settings.billing_jsonl), ("sqlite", settings.billing_sqlite), ("webhook", settings.billing_webhook)
        )
        if value
    ]
    if not chosen:
        return None
    if len(chosen) > 1:
        raise ValueError("choose one of billing_jsonl, billing_sqlite, billing_webhook")
    kind, value = chosen[0]
    sink = JsonlSink(value) if kind == "jsonl" else SqliteSink(value) if kind == "sqlite" else WebhookSink(value)
    return Biller(sink, spill_path=settings.billing_spill)


#: Settings that have a command-line option of the same name.
_OPTIONS = (
    "backend", "host", "port", "instant", "renderer", "log_level", "prometheus",
    "billing_jsonl", "billing_sqlite", "billing_webhook", "billing_spill", "lifetime_s",
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
    serve.add_argument("--renderer", help="prompt renderer: harmony (default), chatml, or '' for none")
    serve.add_argument("--log-level", help="default warning")
    serve.add_argument("--prometheus", action="store_true", default=None, help="export metrics at GET /metrics (prometheus extra)")
    serve.add_argument("--lifetime-s", type=float, help="WebSocket connection lifetime, seconds (default 3600)")
    serve.add_argument("--billing-jsonl", metavar="PATH", help="write usage records to a JSONL file")
    serve.add_argument("--billing-sqlite", metavar="PATH", help="write usage records to a SQLite database")
    serve.add_argument("--billing-webhook", metavar="URL", help="POST usage records to a webhook (needs the webhook extra)")
    serve.add_argument(
        "--billing-spill", metavar="PATH", help="write-ahead spill file for records the sink cannot take yet (replayed at start)"
    )
    serve.set_defaults(func=_serve)
    sub.add_parser("bench", help="benchmark the server over loopback (`responses-cache bench --help`)", add_help=False)
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["bench"]:  # the bench command parses its own options
        from .bench import main as bench_main

        return bench_main(arguments[1:])
    args = parser.parse_args(arguments)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
