"""What an in-process request needs from the server and the host application.

Middleware that calls the app it wraps in-process (the bridge's turns, the vLLM adapter's calls
to vLLM's own routes) builds ASGI scopes itself, and handlers read more of the scope than the
request line: Starlette and FastAPI handlers reach ``request.app.state`` (vLLM keeps its serving
objects there) and ``request.state``. :class:`HostScope` carries those over from a scope the host
passed down."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any


class HostScope:
    """What a request's scope gets from the server and the host app, for in-process requests.

    :meth:`observe` takes it from a scope the host passed down (the upgrade's): the host
    application (``"app"``, set by Starlette/FastAPI on every scope before their middleware
    runs) and the lifespan state (``"state"``, which servers copy into every request). Each
    in-process request gets the app as is and its own shallow copy of the state, as a server
    gives each request."""

    def __init__(self) -> None:
        self.app: Any = None
        self.state: dict[str, Any] | None = None

    def observe(self, scope: Mapping[str, Any]) -> None:
        if scope.get("app") is not None:
            self.app = scope["app"]
        if isinstance(scope.get("state"), dict):
            self.state = scope["state"]

    def apply(self, scope: MutableMapping[str, Any]) -> None:
        if self.app is not None:
            scope["app"] = self.app
        if self.state is not None:
            scope["state"] = dict(self.state)
