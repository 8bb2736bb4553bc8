"""What the HTTP routes and the WebSocket session share: turning a request into a :class:`Turn`,
finding the state it continues from (:meth:`Responder.parent_of`, the one place that
decides it for every edge), and running it.

Resolution goes down the tiers and stops at the first that has the state:

1. the connection cache (WebSocket only, in :class:`~responses_cache.session.session.Session`);
2. the process-wide :class:`~responses_cache.storage.hot.HotCache` (HTTP and WebSocket; the token log
   is kept, so the next render appends);
3. the durable store, one round trip for the whole chain, with the token-log snapshot when the
   store keeps one and its fingerprint matches (the next render appends);
4. the store without a usable snapshot: the next render is a full one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Literal, Protocol

import msgspec

from ..backends.routing import Route, Router
from ..conversation import EMPTY, compaction, encrypted_reasoning
from ..conversation.sealing import Sealer
from ..limits.quotas import ALLOWED, UNLIMITED, Admission, Quotas
from ..observability.logs import current_turn
from ..observability.tracing import trace_id_of
from ..pipeline.append import append_not_enabled
from ..pipeline.generate import Emit
from ..pipeline.pipeline import Pipeline
from ..pipeline.turn import Lineage, Transport, Turn
from ..protocol.codec import encode
from ..protocol.errors import ResponsesError, invalid_request, previous_response_not_found
from ..protocol.ids import new_id, new_response_id
from ..protocol.items import Item
from ..protocol.request import RAW_EMPTY, CreateResponse, decode_input
from ..protocol.response import CompactedResponse
from ..protocol.tools import parse_tools
from ..storage.hot import HotCache
from ..storage.references import ItemIndex, resolve_references
from ..storage.state import ResponseState, open_calls_after
from ..storage.store import ResponseStore
from ..tokens.base import Renderer
from ..tokens.snapshot import restore

Tier = Literal["hot", "snapshot", "store"]


class TurnCache(Protocol):
    """A connection's cache as one turn sees it (the WebSocket session's; HTTP has none)."""

    @property
    def items(self) -> ItemIndex:
        """The connection's items by id (``item_reference``)."""
        ...

    def cached_parent(self) -> tuple[ResponseState, bool] | None:
        """The turn's ``previous_response_id`` in the cache, and whether it was found only because
        superseded responses are kept for a grace period; ``None`` when it is not there."""
        ...

    def full_input_match(
        self, items: list[Item], tools_fingerprint: bytes, renderer: Renderer | None
    ) -> tuple[ResponseState, int] | None:
        """For a request without ``previous_response_id``: the cached state its input continues and
        how many of its leading items that state already holds (its token log cut there by the
        route's ``renderer``)."""
        ...


class ParentResolver(Protocol):
    """A backend with a response store of its own (the bridge's wrapped app)."""

    async def resolves_previous_response_ids(self, model: str, headers: Mapping[str, str]) -> bool:
        """Whether a ``previous_response_id`` handed to it would be looked up (not ignored)."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class EdgeContext:
    """What a transport knows of a request besides its body, handed to :meth:`Responder.prepare`."""

    #: The quota admission the turn runs under.
    admission: Admission | None = None
    #: Credentials from the client's request, forwarded to backends that need them.
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    #: The client's W3C trace-context headers.
    trace: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class _Found:
    """What :meth:`Responder.parent_of` has found so far (the tier too when it refuses)."""

    items: list[Item]
    parent: ResponseState | None = None
    reused_items: int = 0
    tier: str = "none"
    delegated_parent: str | None = None


class Responder:
    def __init__(
        self,
        router: Router,
        pipeline: Pipeline,
        store: ResponseStore | None,
        *,
        delegate_misses: ParentResolver | None = None,
        hot: HotCache | None = None,
        sealer: Sealer | None = None,
        compaction_ttl_s: float = compaction.DEFAULT_TTL_S,
        quotas: Quotas | None = None,
    ) -> None:
        self.router = router
        #: Per-tenant quotas (``None``: none); the edges admit each turn through :meth:`admit`.
        self.quotas = quotas
        self.pipeline = pipeline
        self.store = store
        #: Hand an unknown ``previous_response_id`` (``store: true``) to this backend instead of
        #: hydrating it here, when it says it resolves ids: the bridge's wrapped app keeps its own
        #: store. An app that would ignore the id gets no such turn (``previous_response_not_found``).
        self.delegate_misses = delegate_misses
        self.hot = hot
        #: Seals reasoning for ``include: ["reasoning.encrypted_content"]`` and opens what clients
        #: send back (``None``: the option does nothing, and blobs pass through unopened).
        self.sealer = sealer
        #: How long a compaction item opens after it was made.
        self.compaction_ttl_s = compaction_ttl_s
        #: Continuations resolved from the hot cache.
        self.hot_hits = 0
        #: Continuations rebuilt from the store (with or without a snapshot).
        self.hydrations = 0
        #: Of those, the ones whose token log came back from the snapshot (no full render).
        self.snapshot_restores = 0

    def _compaction_sealer(self, tenant: str) -> Callable[[str, str], compaction.Compaction] | None:
        """Seals an automatic compaction's summary for ``tenant`` (``None`` without a key, or
        for a bridged app)."""
        sealer = self.sealer
        if sealer is None or self.delegate_misses is not None:
            return None
        ttl = self.compaction_ttl_s

        def seal(summary: str, item_id: str) -> compaction.Compaction:
            return compaction.seal(sealer, tenant, summary, ttl_s=ttl, item_id=item_id, replaces_history=True)

        return seal

    @property
    def supports_steering(self) -> bool:
        """Steering needs the cached parent here: a bridged app continues from its own store,
        which holds the whole target, not the part generated before the interrupt."""
        return self.delegate_misses is None

    def prepare(
        self,
        request: CreateResponse,
        tenant: str,
        transport: Transport,
        lane: str | None = None,
        *,
        edge: EdgeContext | None = None,
    ) -> Turn:
        """Decode a request's input and tools (new items only) and give the turn its id; what
        the edge knows of the request (``edge``) goes on the turn as it is made."""
        if request.conversation is not None:
            raise invalid_request(
                "The 'conversation' parameter is not supported by this server; use previous_response_id.",
                "conversation",
                "unsupported_parameter",
            )
        if request.append and (transport != "websocket" or self.delegate_misses is not None):
            # The extension keeps a response open inside this server's pipeline: not over HTTP, and
            # not for a bridged app, which continues from its own store.
            raise append_not_enabled()
        items = decode_input(request.input)
        edge = edge or EdgeContext()
        seal = None
        if self.delegate_misses is None:  # a bridged app seals and opens its own reasoning
            if self.sealer is not None:
                items = encrypted_reasoning.open_items(self.sealer, tenant, items)
            # Compaction items are opened (their summary restored) or refused with a clear 400.
            items = compaction.open_items(self.sealer, tenant, items)
            if self.sealer is not None and request.include and encrypted_reasoning.INCLUDE in request.include:
                # Without a key the option is accepted and does nothing (clients such as Codex
                # always ask for it): reasoning then carries no encrypted_content.
                seal = encrypted_reasoning.sealer_for(self.sealer, tenant)
        tools = parse_tools(request.tools)
        # Decoded, the input leaves the request, and the tools are the parsed set's own copy: the
        # request no longer points into the frame or body it came from (a megabyte input is kept
        # once, as items). A steering successor reruns the request with new input and these tools.
        request = msgspec.structs.replace(
            request, input=RAW_EMPTY, tools=msgspec.Raw(tools.raw) if len(request.tools) else request.tools
        )
        return Turn(
            request=request,
            items=items,
            tools=tools,
            tenant=tenant,
            transport=transport,
            lane=lane,
            response_id=new_response_id(request.previous_response_id),
            created_at=time.time(),
            seal_reasoning=seal,
            seal_compaction=self._compaction_sealer(tenant),
            admission=edge.admission,
            headers=edge.headers,
            trace=edge.trace,
        )

    async def resolve_references(
        self, turn: Turn, parent: ResponseState | None, connection: ItemIndex | None = None
    ) -> list[Item]:
        """The turn's items with its ``item_reference`` items replaced by the items they name (see
        :mod:`responses_cache.storage.references`); a backend with its own store gets the unresolved ones."""
        return await resolve_references(
            turn.items,
            turn.tenant,
            connection=connection,
            process=self.pipeline.stored_items,
            store=self.store,
            parent=parent,
            pass_through=self.delegate_misses is not None,
        )

    async def parent_of(self, turn: Turn, route: Route, cache: TurnCache | None = None) -> Lineage:
        """The state ``turn`` continues from, found down the tiers, with the items that run from
        it: item references resolved, and a full-input resend cut to the items its parent does
        not hold (:attr:`Lineage.items`, :attr:`Lineage.reused_items`). A ``previous_response_id`` that no
        tier has is ``previous_response_not_found``, unless the backend keeps its own store and
        resolves ids (the bridge's wrapped app): then the turn is delegated to it.

        Without a connection cache (HTTP), the process's hot cache and the store are where a
        ``previous_response_id`` is looked up whatever the request's ``store``; over WebSocket a
        ``store: false`` request has only its connection cache, as the protocol says.

        The turn's span starts here (continuing the client's trace, ``turn.trace``) and its
        ``resolve`` stage covers the lookup; a refused turn ends its span here, a resolved one
        when :meth:`run` ends."""
        span = self.pipeline.tracer.start_turn(
            turn.trace,
            {
                "responses_cache.tenant": turn.tenant,
                "gen_ai.request.model": turn.model,
                "responses_cache.transport": turn.transport,
                "gen_ai.response.id": turn.response_id,
            },
        )
        current_turn.set((turn.response_id, span.trace_id or trace_id_of(turn.trace)))
        found = _Found(turn.items)
        try:
            with span.stage("resolve") as stage:
                await self._parent_of(turn, route, cache, found)
                stage.set("responses_cache.parent_tier", found.tier)
        except BaseException as exc:
            span.set("responses_cache.parent_tier", found.tier)
            span.end("rejected", exc)
            raise
        span.set("responses_cache.parent_tier", found.tier)
        self.pipeline.metrics.inc("parent_tier_total", {"transport": turn.transport, "tier": found.tier})
        return Lineage(found.parent, found.items, found.reused_items, found.tier, found.delegated_parent, span)

    async def _parent_of(self, turn: Turn, route: Route, cache: TurnCache | None, found: _Found) -> None:
        metrics, labels = self.pipeline.metrics, {"transport": turn.transport}
        wanted = turn.request.previous_response_id
        parent: ResponseState | None = None
        if wanted is not None:
            metrics.inc("incremental_sends_total", labels)
            cached = cache.cached_parent() if cache is not None else None
            if cached is not None:
                parent, grace = cached
                found.parent, found.tier = parent, "connection"
                metrics.inc("cache_hits_total", labels)
                if grace:
                    metrics.inc("cache_grace_hits_total", labels)
            else:
                if cache is not None:
                    metrics.inc("cache_misses_total", labels)
                delegate = self.delegate_misses
                if turn.request.store and delegate is not None and await delegate.resolves_previous_response_ids(
                    turn.model, turn.headers
                ):
                    found.delegated_parent, found.tier = wanted, "delegated"
                elif cache is None or turn.request.store:
                    # The process-wide hot cache, then the store (and its token-log snapshot).
                    stored = await self.find_stored(turn.tenant, wanted, route)
                    if stored is not None:
                        parent, found.tier = stored
                        found.parent = parent
                        metrics.inc(f"resolved_{stored[1]}_total", labels)
                if parent is None and found.delegated_parent is None:
                    metrics.inc("previous_response_not_found_total", labels)
                    raise previous_response_not_found(wanted)
            if parent is not None and parent.response.status in ("queued", "in_progress"):
                raise invalid_request(  # a background response still running
                    f"Previous response with id '{wanted}' is still {parent.response.status}; continue from it once it has finished.",
                    "previous_response_id",
                    "previous_response_in_progress",
                )
        found.items = items = await self.resolve_references(turn, parent, cache.items if cache is not None else None)
        if wanted is None and cache is not None:
            metrics.inc("full_sends_total", labels)
            match = cache.full_input_match(items, turn.tools.fingerprint, route.renderer)
            if match is not None:
                parent, reused = match
                found.parent, found.items, found.reused_items, found.tier = parent, items[reused:], reused, "full_input"
                metrics.inc("full_input_reuse_total", labels)

    async def count_input_tokens(self, request: CreateResponse, tenant: str) -> int:
        """``POST /v1/responses/input_tokens``: the prompt tokens the engine would receive for
        ``request`` (``input``, ``instructions``, ``tools``, ``previous_response_id``), found as a
        create finds its parent — so a parent in the hot cache, or stored with a usable token-log
        snapshot, costs only the new items' render. A route without a renderer (a chat-style
        backend, the bridge) has no prompt to count: 400 ``unsupported_value``."""
        if request.model is None or request.model == "":
            models = self.router.models()
            if not models:
                raise invalid_request("Missing required parameter: 'model'.", "model", "missing_required_parameter")
            request.model = models[0]
        turn = self.prepare(request, tenant, "http")
        route = self.router.resolve(turn.model, tenant)
        if route.renderer is None or self.delegate_misses is not None:
            raise invalid_request(
                f"Input token counts are not available for model '{turn.model}': its backend takes messages, not a prompt.",
                "model",
                "unsupported_value",
            )
        lineage = await self.parent_of(turn, route)
        return await self.pipeline.count_prompt(turn, lineage, route)

    async def compact(self, request: CreateResponse, tenant: str, admission: Admission | None = None) -> CompactedResponse:
        """``POST /v1/responses/compact``: the conversation (``input`` after
        ``previous_response_id``'s, found as a create finds it) compacted into its user messages
        and one sealed compaction item (see :meth:`Pipeline.compact`). Needs the server's sealing
        key: without one it is 400 ``unsupported_value``."""
        if request.model is None or request.model == "":
            raise invalid_request("Missing required parameter: 'model'.", "model", "missing_required_parameter")
        sealer = self.sealer
        if sealer is None or self.delegate_misses is not None:
            raise invalid_request(
                "Compaction is not available on this server (it has no sealing key).", "model", "unsupported_value"
            )
        turn = self.prepare(request, tenant, "http", edge=EdgeContext(admission=admission))
        run = None
        try:
            route = self.router.resolve(turn.model, tenant)
            lineage = await self.parent_of(turn, route)
            ttl = self.compaction_ttl_s

            def seal(summary: str, item_id: str) -> compaction.Compaction:
                return compaction.seal(sealer, tenant, summary, ttl_s=ttl, item_id=item_id)

            run = self.pipeline.turn_run(turn, lineage, route)
            return await run.compact(seal)
        finally:
            if admission is not None:
                admission.release(run.billed_tokens if run is not None else 0)

    async def admit(self, tenant: str) -> Admission:
        """Admit one request of ``tenant`` under its quota, or raise
        :class:`~responses_cache.limits.quotas.QuotaExceeded` (429). The admission goes on the turn
        (``turn.admission``); :meth:`run` releases it with what the turn used, and whoever ends
        the turn before :meth:`run` releases it (releasing twice does nothing)."""
        if self.quotas is None:
            return Admission(None, tenant, UNLIMITED, "", ALLOWED)
        return await self.quotas.admit(tenant, new_id("lease"))

    async def run(self, turn: Turn, lineage: Lineage, route: Route, emit: Emit) -> ResponseState:
        """Run a turn; a finished ``store: true`` state stays hot for the next continuation. Its
        quota admission is released when it ends, charged with the tokens billed for it."""
        run = self.pipeline.turn_run(turn, lineage, route)
        try:
            state = await run.respond(emit)
        finally:
            if turn.admission is not None:
                turn.admission.release(run.billed_tokens)
        if self.hot is not None and self.store is not None and self.delegate_misses is None:
            self.hot.put(state)
        return state

    async def find_stored(self, tenant: str, response_id: str, route: Route | None) -> tuple[ResponseState, Tier] | None:
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
            own: list[Item] = [*stored.input_items, *stored.response.output]
            try:  # stored compaction items: opened without an expiry (the server kept them)
                own = compaction.open_items(self.sealer, tenant, own, now=-1.0)
            except ResponsesError:
                return None
            conversation = conversation.extend(own)
            open_calls = open_calls_after(open_calls, own)
        start = compaction.history_start(conversation.items()) if self.sealer is not None else 0
        if start:  # an automatic compaction replaced the conversation before it
            conversation = EMPTY.extend(conversation.items()[start:])
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
