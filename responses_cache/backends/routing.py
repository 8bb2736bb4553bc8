"""Model routing: resolve a model name to a :class:`Route` once, then reuse it.

A route names the backend, the renderer (tokenizer + template) and the context window.
:class:`RouteCache` keeps one resolution per connection and asks the router again only when the
requested model or the router's ``version`` changes. ``affinity_key`` pins a conversation lane to
one engine replica so the engine's KV prefix cache stays warm.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..protocol.errors import ResponsesError
from .base import Backend

if TYPE_CHECKING:
    from ..tokens.base import Renderer


#: The context window a route has unless configured.
DEFAULT_CONTEXT_WINDOW = 131_072


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    model: str
    backend: Backend
    renderer: Renderer | None
    context_window: int = DEFAULT_CONTEXT_WINDOW
    replicas: int = 1

    @property
    def window(self) -> int:
        """The prompt limit: ``context_window``, or the engine's own when the backend knows a
        smaller one (``backend.context_window``, which an adapter reads from the engine at start)."""
        engine = getattr(self.backend, "context_window", None)
        return min(self.context_window, engine) if isinstance(engine, int) and engine > 0 else self.context_window

    def replica_for(self, affinity_key: str) -> int:
        """A stable replica index for a conversation lane."""
        if self.replicas <= 1:
            return 0
        digest = hashlib.blake2b(affinity_key.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.replicas


class Router(Protocol):
    """Resolves a model name. ``version`` changes whenever its configuration does."""

    @property
    def version(self) -> int: ...

    def resolve(self, model: str, tenant: str) -> Route: ...

    def models(self) -> Sequence[str]: ...


class StaticRouter:
    """Routes every model name in ``routes`` (or any name, with ``default``)."""

    def __init__(self, routes: Mapping[str, Route], *, default: Route | None = None) -> None:
        self._routes = dict(routes)
        self._default = default
        self.version = 0
        self.resolutions = 0

    def resolve(self, model: str, tenant: str) -> Route:
        self.resolutions += 1
        route = self._routes.get(model, self._default)
        if route is None:
            raise ResponsesError(
                f"The model '{model}' does not exist or you do not have access to it.",
                status=404,
                code="model_not_found",
                param="model",
            )
        return route

    def models(self) -> Sequence[str]:
        return list(self._routes) or ([self._default.model] if self._default else [])

    def backends(self) -> list[Backend]:
        """The distinct backends of every route (what a service starts and closes)."""
        routes = [*self._routes.values(), *([self._default] if self._default else [])]
        return list({id(r.backend): r.backend for r in routes}.values())

    def set_route(self, model: str, route: Route) -> None:
        self._routes[model] = route
        self.version += 1


class RouteCache:
    """One connection's resolved route, reused until the model or router version changes."""

    __slots__ = ("_key", "_route", "router", "tenant")

    def __init__(self, router: Router, tenant: str) -> None:
        self.router = router
        self.tenant = tenant
        self._key: tuple[str, int] | None = None
        self._route: Route | None = None

    def get(self, model: str) -> Route:
        key = (model, self.router.version)
        if self._key == key and self._route is not None:
            return self._route
        route = self.router.resolve(model, self.tenant)
        self._key, self._route = key, route
        return route
