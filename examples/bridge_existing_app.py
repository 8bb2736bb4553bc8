"""WebSocket mode for a Responses server you already have.

``WebSocketMode(app)`` wraps any ASGI app that serves ``POST /v1/responses`` (with ``stream: true``).
Each WebSocket turn is forwarded in-process to that endpoint with the whole conversation, taken
from the connection cache, so the app needs no ``previous_response_id`` support of its own. HTTP
requests reach the app unchanged.

Here the "existing app" is this package's own reference server with its WebSocket mode switched
off, standing in for yours (vLLM's or SGLang's FastAPI app, a gateway, …)::

    python examples/bridge_existing_app.py          # then: ws://127.0.0.1:8000/v1/responses
"""

from __future__ import annotations

import uvicorn
from starlette.applications import Starlette

from responses_cache import SimulatedConfig, SimulatedEngine, WebSocketMode, create_app


def existing_app() -> Starlette:
    """Any ASGI Responses app; here the reference server's HTTP routes alone."""
    app = create_app(backend=SimulatedEngine(SimulatedConfig(output_tokens_per_s=200)))
    return Starlette(routes=app.routes, lifespan=app.router.lifespan_context)


app = WebSocketMode(existing_app())

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=8000)
