"""The ``responses-cache`` command: ``serve`` (and ``bench``, see :mod:`responses_cache.bench`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


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
    keys = args.api_key or ([os.environ["RESPONSES_CACHE_API_KEY"]] if os.environ.get("RESPONSES_CACHE_API_KEY") else None)
    app = create_app(ServerConfig(backend=backend, api_keys=keys, renderer=args.renderer or None))
    print(f"responses-cache: serving {args.backend} on http://{args.host}:{args.port}/v1 (WebSocket: ws://{args.host}:{args.port}/v1/responses)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, ws_max_size=16 * 1024 * 1024)
    return 0


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
    serve.set_defaults(func=_serve)
    bench = sub.add_parser("bench", help="benchmark the server over loopback (see docs/benchmarks.md)")
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def _bench(args: argparse.Namespace) -> int:
    from .bench import main as bench_main

    return bench_main(args.rest)


if __name__ == "__main__":
    raise SystemExit(main())
