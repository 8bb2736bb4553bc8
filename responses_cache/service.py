"""What the HTTP routes and the WebSocket session share: turning a request into a :class:`Turn`,
running it, and resolving ``previous_response_id`` beyond the connection cache.

Resolution goes down the tiers and stops at the first that has the state:

1. the connection cache (WebSocket only, in :class:`~responses_cache.session.Session`);
2. the process-wide :class:`~responses_cache.hot.HotCache` (HTTP and WebSocket; the token log
   is kept, so the next render appends);
3. the durable store, one round trip for the whole chain, with the token-log snapshot when the
   store keeps one and its fingerprint matches (the next render appends);
4. the store without a usable snapshot: the next render is a full one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Literal, Protocol

from .conversation import EMPTY
from .hot import HotCache
from .ids import new_id
from .pipeline.generate import Emit
from .pipeline.pipeline import Pipeline
from .pipeline.turn import Transport, Turn
from .protocol.codec import encode
from .protocol.errors import invalid_request
from .protocol.request import CreateResponse, decode_input
from .protocol.tools import parse_tools
from .references import ItemIndex, resolve_references
from .routing import Route, Router
from .state import ResponseState, open_calls_after
from .store import ResponseStore
from .tokens.base import Renderer
from .tokens.snapshot import restore

Tier = Literal["hot", "snapshot", "store"]


class ParentResolver(Protocol):
    """A backend with a response store of its own (the bridge's wrapped app)."""

    async def resolves_previous_response_ids(self, model: str, headers: Mapping[str, str]) -> bool:
        """Whether a ``previous_response_id`` handed to it would be looked up (not ignored)."""
        ...


class ResponsesService:
    def __init__(
        self,
        router: Router,
        pipeline: Pipeline,
        store: ResponseStore | None,
        *,
        delegate_misses: ParentResolver | None = None,
        hot: HotCache | None = None,
    ) -> None:
        self.router = router
        self.pipeline = pipeline
        self.store = store
        #: Hand an unknown ``previous_response_id`` (``store: true``) to this backend instead of
        #: hydrating it here, when it says it resolves ids: the bridge's wrapped app keeps its own
        #: store. An app that would ignore the id gets no such turn (``previous_response_not_found``).
        self.delegate_misses = delegate_misses
        self.hot = hot
        #: Continuations resolved from the hot cache.
        self.hot_hits = 0
        #: Continuations rebuilt from the store (with or without a snapshot).
        self.hydrations = 0
        #: Of those, the ones whose token log came back from the snapshot (no full render).
        self.snapshot_restores = 0

    @property
    def supports_steering(self) -> bool:
        """Steering needs the cached parent here: a bridged app continues from its own store,
        which holds the whole target, not the part generated before the interrupt."""
        return self.delegate_misses is None

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

    async def resolve_references(
        self, turn: Turn, parent: ResponseState | None, connection: ItemIndex | None = None
    ) -> None:
        """Replace the turn's ``item_reference`` items by the items they name (see
        :mod:`responses_cache.references`); a backend with its own store gets the unresolved ones."""
        turn.items = await resolve_references(
            turn.items,
            turn.tenant,
            connection=connection,
            process=self.pipeline.stored_items,
            store=self.store,
            parent=parent,
            pass_through=self.delegate_misses is not None,
        )

    async def run(self, turn: Turn, parent: ResponseState | None, route: Route, emit: Emit) -> ResponseState:
        """Run a turn; a finished ``store: true`` state stays hot for the next continuation."""
        state = await self.pipeline.run(turn, parent, route, emit)
        if self.hot is not None and self.store is not None and self.delegate_misses is None:
            self.hot.put(state)
        return state

    async def resolve(self, tenant: str, response_id: str, route: Route | None) -> tuple[ResponseState, Tier] | None:
        """A stored response's state from the hot cache or the store (``None``: not found).

        A hot entry is confirmed with the store, so a response deleted or expired there (by any
        process) is not continued from here either."""
        if self.store is None:
            return None
        if self.hot is not None:
            state = self.hot.get(tenant, response_id)
            if state is not None:
                if await self.store.contains(tenant, response_id):
                    self.hot_hits += 1
                    return state, "hot"
                self.hot.evict(tenant, response_id)
                return None
        return await self.hydrate(tenant, response_id, route.renderer if route is not None else None)

    async def hydrate(
        self, tenant: str, response_id: str, renderer: Renderer | None = None
    ) -> tuple[ResponseState, Tier] | None:
        """Rebuild a state from the durable store: the chain in one lookup, and the token log
        from its snapshot when ``renderer`` still renders it the same way."""
        if self.store is None:
            return None
        chain = await self.store.get_chain(tenant, response_id)
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
        tools = parse_tools(last.tools_json)
        log = fingerprint = None
        if renderer is not None and last.snapshot is not None and self.store.keeps_snapshots:
            fingerprint = renderer.fingerprint(last.instructions, tools)
            log = restore(renderer, fingerprint, [s.snapshot for s in chain])
            if log is not None and log.num_items != conversation.count:
                log = None  # the snapshot does not cover the stored items: render in full
        if log is None:
            fingerprint = None
        else:
            self.snapshot_restores += 1
        state = ResponseState(
            response=last.response,
            tenant=tenant,
            lane=None,
            conversation=conversation,
            instructions=last.instructions,
            tools=tools,
            fingerprint=fingerprint,
            token_log=log,
            route=None,
            open_calls=open_calls,
            conversation_key=chain[0].response.prompt_cache_key or chain[0].id,
            total_bytes=sum(len(encode(i)) for s in chain for i in (*s.input_items, *s.response.output)),
        )
        return state, ("snapshot" if log is not None else "store")
