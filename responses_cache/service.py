"""What the HTTP routes and the WebSocket session share: turning a request into a :class:`Turn`,
and resolving ``previous_response_id`` from the durable store (hydration)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from starlette.types import ASGIApp

from .conversation import EMPTY
from .ids import new_id
from .pipeline.pipeline import Pipeline
from .pipeline.turn import Transport, Turn
from .protocol.errors import invalid_request
from .protocol.request import CreateResponse, decode_input
from .protocol.tools import parse_tools
from .routing import Router
from .state import ResponseState, open_calls_after
from .store import ResponseStore, load_chain


class ParentResolver(Protocol):
    """A backend with a response store of its own (the bridge's wrapped app)."""

    async def resolves_previous_response_ids(self, model: str, headers: Mapping[str, str]) -> bool:
        """Whether a ``previous_response_id`` handed to it would be looked up (not ignored)."""
        ...


class ResponsesService:
    def __init__(
        self, router: Router, pipeline: Pipeline, store: ResponseStore | None, *, delegate_misses: ParentResolver | None = None
    ) -> None:
        self.router = router
        self.pipeline = pipeline
        self.store = store
        #: Hand an unknown ``previous_response_id`` (``store: true``) to this backend instead of
        #: hydrating it here, when it says it resolves ids: the bridge's wrapped app keeps its own
        #: store. An app that would ignore the id gets no such turn (``previous_response_not_found``).
        self.delegate_misses = delegate_misses
        self.hydrations = 0

    def prepare(self, request: CreateResponse, tenant: str, transport: Transport, lane: str | None = None) -> Turn:
        """Decode a request's input and tools (new items only) and give the turn its id."""
        if request.conversation is not None:
            raise invalid_request(
                "The 'conversation' parameter is not supported by this server; use previous_response_id.",
                "conversation",
                "unsupported_parameter",
            )
        return Turn(
            request=request,
            items=decode_input(request.input),
            tools=parse_tools(request.tools),
            tenant=tenant,
            transport=transport,
            lane=lane,
            response_id=new_id("resp"),
            created_at=time.time(),
        )

    async def hydrate(self, tenant: str, response_id: str) -> ResponseState | None:
        """Rebuild a state from the durable store (no token log: the next render is a full one)."""
        if self.store is None:
            return None
        chain = await load_chain(self.store, tenant, response_id)
        if chain is None:
            return None
        self.hydrations += 1
        conversation = EMPTY
        open_calls: dict[str, str] = {}
        for stored in chain:
            own = [*stored.input_items, *stored.response.output]
            conversation = conversation.extend(own)
            open_calls = open_calls_after(open_calls, own)
        last = chain[-1]
        return ResponseState(
            response=last.response,
            tenant=tenant,
            lane=None,
            conversation=conversation,
            instructions=last.instructions,
            tools=parse_tools(last.tools_json),
            fingerprint=None,
            token_log=None,
            route=None,
            open_calls=open_calls,
            conversation_key=chain[0].response.prompt_cache_key or chain[0].id,
        )


def bridge_service(app: ASGIApp, *, resolves_previous_response_ids: bool | None = None) -> ResponsesService:
    """A service whose every turn is forwarded to ``app``'s own ``POST /v1/responses``."""
    from .bridge import AppBackend
    from .routing import Route, StaticRouter

    backend = AppBackend(app, resolves_previous_response_ids=resolves_previous_response_ids)
    route = Route(name="bridge", model="*", backend=backend, renderer=None)
    return ResponsesService(StaticRouter({}, default=route), Pipeline(), None, delegate_misses=backend)
