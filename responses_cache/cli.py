"""The ``responses-cache`` command: ``serve`` (and ``bench``, see :mod:`responses_cache.bench`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .billing import Biller


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import ServerConfig, create_app
    from .backends import load_backend

    options: dict[str, object] = {}
    if args.backend == "simulated":
        options["instant"] = args.instant
    elif args.instant:
        print("--instant applies to the simulated backend only", file=sys.stderr)
        return 2
    backend = load_backend(args.backend, **options)
    billing = _biller(args)
    keys = args.api_key or ([os.environ["RESPONSES_CACHE_API_KEY"]] if os.environ.get("RESPONSES_CACHE_API_KEY") else None)
    metrics = None
    if args.prometheus:
        from .metrics import PrometheusMetrics

        metrics = PrometheusMetrics()
    app = create_app(
        ServerConfig(backend=backend, api_keys=keys, renderer=args.renderer or None, billing=billing, metrics=metrics)
    )
    print(f"responses-cache: serving {args.backend} on http://{args.host}:{args.port}/v1 (WebSocket: ws://{args.host}:{args.port}/v1/responses)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, ws_max_size=16 * 1024 * 1024)
    return 0


def _biller(args: argparse.Namespace) -> Biller | None:
    from .billing import Biller, JsonlSink, SqliteSink, WebhookSink

    chosen = [
        (flag, value)
        for flag, value in (("jsonl", args.billing_jsonl), ("sqlite", args.billing_sqlite), ("webhook", args.billing_webhook))
        if value
    ]
    if not chosen:
        return None
    if len(chosen) > 1:
        raise SystemExit("responses-cache: choose one of --billing-jsonl, --billing-sqlite, --billing-webhook")
    kind, value = chosen[0]
    sink = JsonlSink(value) if kind == "jsonl" else SqliteSink(value) if kind == "sqlite" else WebhookSink(value)
    return Biller(sink, spill_path=args.billing_spill)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="responses-cache", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the reference Responses server (HTTP, SSE and WebSocket mode)")
    serve.add_argument("--backend", default=os.environ.get("RESPONSES_CACHE_BACKEND", "simulated"))
    serve.add_argument("--host", default=os.environ.get("RESPONSES_CACHE_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("RESPONSES_CACHE_PORT", "8000")))
    serve.add_argument("--api-key", action="append", help="accepted bearer key (repeatable; env RESPONSES_CACHE_API_KEY)")
    serve.add_argument("--instant", action="store_true", help="simulated engine with zero latency")
    serve.add_argument("--renderer", default="harmony", help="prompt renderer: harmony, chatml, or '' for none")
    serve.add_argument("--log-level", default="warning")
    serve.add_argument("--prometheus", action="store_true", help="export metrics at GET /metrics (prometheus extra)")
    serve.add_argument("--billing-jsonl", metavar="PATH", help="write usage records to a JSONL file")
    serve.add_argument("--billing-sqlite", metavar="PATH", help="write usage records to a SQLite database")
    serve.add_argument("--billing-webhook", metavar="URL", help="POST usage records to a webhook (needs the webhook extra)")
    serve.add_argument(
        "--billing-spill", metavar="PATH", default=os.environ.get("RESPONSES_CACHE_BILLING_SPILL"),
        help="write-ahead spill file for records the sink cannot take yet (replayed at start)",
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
