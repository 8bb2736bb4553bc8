"""The HTTP Responses API: ``POST /v1/responses`` (JSON or SSE), ``GET``/``DELETE
/v1/responses/{id}`` and ``GET /v1/models``, as Starlette routes over :class:`Responder`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response as HTTPResponse
from starlette.responses import StreamingResponse
from starlette.routing import Route as HTTPRoute
from starlette.types import Receive, Scope, Send

from ..backends.base import BackendError
from ..core.auth import Authenticator
from ..core.background import BackgroundRunner, Frame
from ..core.lifecycle import Drain
from ..core.responder import EdgeContext, Responder
from ..limits.input_rate import InputRate
from ..limits.quotas import Admission, Decision, QuotaExceeded, rate_limit_headers
from ..observability.tracing import trace_headers
from ..protocol import events as ev
from ..protocol.codec import encode
from ..protocol.errors import (
    HTTPErrorBody,
    ResponsesError,
    invalid_request,
    server_error,
    shutting_down,
)
from ..protocol.request import decode_count, decode_create
from ..session.session import InputBudget
from ..storage import listing
from ..storage.state import ResponseState
from ..storage.store import StoredResponse

_DONE = object()
#: Bodies from this size on yield to other requests between decoding stages.
_LARGE_BODY = 64 * 1024
logger = logging.getLogger("responses_cache.http")


def error_response(error: ResponsesError) -> HTTPResponse:
    return HTTPResponse(
        encode(HTTPErrorBody(error.payload)), status_code=error.status, media_type="application/json", headers=error.headers
    )


def json_response(payload: object, status: int = 200) -> HTTPResponse:
    return HTTPResponse(encode(payload), status_code=status, media_type="application/json")


class HTTPApi:
    def __init__(
        self,
        responder: Responder,
        authenticator: Authenticator,
        *,
        max_body_bytes: int,
        input_budget: InputBudget | None = None,
        background: BackgroundRunner | None = None,
        input_rate: InputRate | None = None,
        drain: Drain | None = None,
    ) -> None:
        self.responder = responder
        self.authenticator = authenticator
        self.max_body_bytes = max_body_bytes
        #: The process-wide budget for request bytes held by unfinished requests (shared with
        #: WebSocket mode): a body is charged as it is read and released when its turn ends.
        self.input_budget = input_budget
        #: Runs ``background: true`` responses (``None``: they are refused).
        self.background = background
        #: Input bytes per second per tenant (shared with WebSocket mode): a body is read no faster.
        self.input_rate = input_rate
        #: The service's drain: while it runs, creates and compactions get 503; it waits for the
        #: turns running here and cancels them at its deadline.
        self.drain = drain

    def _refuse_if_draining(self) -> None:
        if self.drain is not None and self.drain.draining:
            raise shutting_down()

    def routes(self, prefix: str = "/v1") -> list[HTTPRoute]:
        limited = self._rate_headers
        return [
            HTTPRoute(f"{prefix}/responses", limited(self.create), methods=["POST"]),
            HTTPRoute(f"{prefix}/responses/input_tokens", limited(self.input_tokens), methods=["POST"]),
            HTTPRoute(f"{prefix}/responses/compact", limited(self.compact), methods=["POST"]),
            HTTPRoute(f"{prefix}/responses/{{response_id}}", limited(self.retrieve), methods=["GET"]),
            HTTPRoute(f"{prefix}/responses/{{response_id}}/input_items", limited(self.input_items), methods=["GET"]),
            HTTPRoute(f"{prefix}/responses/{{response_id}}", limited(self.delete), methods=["DELETE"]),
            HTTPRoute(f"{prefix}/responses/{{response_id}}/cancel", limited(self.cancel), methods=["POST"]),
            HTTPRoute(f"{prefix}/models", limited(self.models), methods=["GET"]),
        ]

    def _rate_headers(self, handler: Callable[[Request], Awaitable[HTTPResponse]]) -> Callable[[Request], Awaitable[HTTPResponse]]:
        """``handler`` with the tenant's ``x-ratelimit-*`` headers on its answer: as the request's
        admission left them (a create), else where the tenant stands now (nothing counted)."""
        quotas = self.responder.quotas
        if quotas is None:
            return handler

        async def with_headers(request: Request) -> HTTPResponse:
            response = await handler(request)
            decision: Decision | None = getattr(request.state, "rate_limit", None)
            tenant: str | None = getattr(request.state, "tenant", None)
            if decision is None and tenant is not None:
                try:
                    decision = await quotas.status(tenant)
                except Exception:  # the headers are advice: never fail an answer for them
                    logger.exception("could not read the quota counters")
            if decision is not None:
                present = {name for name, _ in response.raw_headers}  # a 429 carries them already
                response.raw_headers.extend(
                    (name.encode(), value.encode())
                    for name, value in rate_limit_headers(decision).items()
                    if name.encode() not in present
                )
            return response

        return with_headers

    async def _admit(self, request: Request, tenant: str) -> Admission:
        """Admit the request under the tenant's quota (429 :class:`QuotaExceeded` otherwise)."""
        try:
            admission = await self.responder.admit(tenant)
        except QuotaExceeded as exc:
            request.state.rate_limit = exc.decision
            raise
        request.state.rate_limit = admission.decision
        return admission

    async def _tenant(self, request: Request) -> str:
        try:
            tenant = await self.authenticator.authenticate(request.headers)
        except Exception:  # fail closed: an authenticator that cannot answer admits no one
            logger.exception("the authenticator failed; the request is refused")
            tenant = None
        if tenant is None:
            raise ResponsesError(
                "Incorrect API key provided.", status=401, code="invalid_api_key", type="invalid_request_error"
            )
        request.state.tenant = tenant
        return tenant

    async def _body(self, request: Request, charge: _Charge, tenant: str) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)
        chunks: list[bytes] = []
        size = 0
        # The tenant's input rate: while it is in debt the next chunk is not asked for, and the
        # server stops reading the socket once its small body buffer is full.
        rate = self.input_rate.open(tenant, per_connection=False) if self.input_rate is not None else None
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise _too_large(self.max_body_bytes)
                if rate is not None:
                    await rate.admit(len(chunk))
                charge.take(len(chunk))  # charged as it is read, as a WebSocket frame is
                chunks.append(chunk)
        finally:
            if rate is not None:
                rate.close()
        return b"".join(chunks)

    async def create(self, request: Request) -> HTTPResponse:
        charge = _Charge(self.input_budget)
        try:
            response, task = await self._create(request, charge)
        except Exception:  # a bug, not the client's doing: still the JSON envelope, never text/plain
            charge.release()
            logger.exception("POST /responses failed")
            return error_response(server_error())
        except BaseException:
            charge.release()
            raise
        if task is None:
            charge.release()
        else:  # the body stays referenced by the turn until it ends, however the response goes
            task.add_done_callback(lambda _: charge.release())
        return response

    async def _create(self, request: Request, charge: _Charge) -> tuple[HTTPResponse, asyncio.Future[ResponseState] | None]:
        try:
            self._refuse_if_draining()
            tenant = await self._tenant(request)
            charge.admission = await self._admit(request, tenant)
            raw = await self._body(request, charge, tenant)
            body = decode_create(raw)
            if len(raw) >= _LARGE_BODY:
                await asyncio.sleep(0)  # decoding took a while: let other requests run in between
            if body.stream_id is not None:
                raise invalid_request("The 'stream_id' parameter is only supported over WebSocket.", "stream_id", "unsupported_parameter")
            if body.background:
                self._check_background(body.store)
            if not body.generate:
                raise invalid_request("The 'generate' parameter is only supported over WebSocket.", "generate", "unsupported_parameter")
            edge = EdgeContext(charge.admission, trace=trace_headers(request.headers))
            turn = self.responder.prepare(body, tenant, "http", edge=edge)
            route = self.responder.router.resolve(turn.model, tenant)
            del raw
            lineage = await self.responder.parent_of(turn, route)
            if body.background:
                assert self.background is not None
                queued = await self.background.submit(turn, lineage, route)
                charge.admission = None  # the background run releases it when it ends
                if not body.stream:
                    return json_response(queued), None
                return _BackgroundStream(self.background.events(tenant, turn.response_id, -1)), None
        except ResponsesError as exc:
            return error_response(exc), None
        except ClientDisconnect:
            return HTTPResponse(status_code=499), None

        queue: asyncio.Queue[object] = asyncio.Queue()

        async def emit(event: ev.Event) -> None:
            if body.stream:
                await queue.put(event)

        async def run() -> ResponseState:
            try:
                return await self.responder.run(turn, lineage, route, emit)
            finally:
                await queue.put(_DONE)

        task = asyncio.ensure_future(run())
        if self.drain is not None:
            self.drain.track(task)
        if not body.stream:
            try:
                state = await task
            except ResponsesError as exc:
                return error_response(exc), task
            return json_response(state.response), task

        first = await queue.get()
        if first is _DONE:  # failed before response.created: a plain JSON error
            try:
                await task
            except ResponsesError as exc:
                return error_response(exc), task
            return error_response(ResponsesError("No events were produced.", status=500, type="server_error")), task

        return _EventStream(first, queue, task), task

    def _check_background(self, store: bool) -> None:
        if self.background is None or self.responder.delegate_misses is not None:
            raise invalid_request("Background mode is not supported by this server.", "background", "unsupported_parameter")
        if not store:
            raise invalid_request("Background mode requires 'store' to be true.", "store", "invalid_value")

    async def retrieve(self, request: Request) -> HTTPResponse:
        """A stored response; ``?stream=true`` (a background response): its events from
        ``starting_after`` on, as they come."""
        try:
            tenant = await self._tenant(request)
            response_id = request.path_params["response_id"]
            stored = await self._stored(tenant, response_id)
            if request.query_params.get("stream", "false").lower() not in ("true", "1"):
                return json_response(stored.response)
            raw_after = request.query_params.get("starting_after", "-1")
            if not raw_after.lstrip("-").isdigit():
                raise invalid_request(
                    f"Invalid type for 'starting_after': expected an integer, but got '{raw_after}'.", "starting_after", "invalid_type"
                )
            runner = self.background
            if not stored.response.background or runner is None:
                raise invalid_request("Only background responses can be streamed again.", "stream", "invalid_value")
            if runner.local(tenant, response_id) is None and runner.relay is None:
                raise invalid_request(
                    "The events of this response are no longer kept; retrieve it without 'stream'.", "stream", "invalid_value"
                )
            return _BackgroundStream(runner.events(tenant, response_id, int(raw_after)))
        except ResponsesError as exc:
            return error_response(exc)

    async def cancel(self, request: Request) -> HTTPResponse:
        """``POST /v1/responses/{id}/cancel``: cancel a background response (any process, with a
        shared store); the response is returned as it ended."""
        try:
            tenant = await self._tenant(request)
            response_id = request.path_params["response_id"]
            if self.background is None:
                await self._stored(tenant, response_id)
                raise invalid_request("Only background responses can be cancelled.", "response_id", "invalid_value")
            return json_response(await self.background.cancel(tenant, response_id))
        except ResponsesError as exc:
            return error_response(exc)

    async def delete(self, request: Request) -> HTTPResponse:
        try:
            tenant = await self._tenant(request)
            response_id = request.path_params["response_id"]
            await self._stored(tenant, response_id)
            assert self.responder.store is not None
            if self.responder.hot is not None:
                self.responder.hot.evict(tenant, response_id)
            await self.responder.store.delete(tenant, response_id)
        except ResponsesError as exc:
            return error_response(exc)
        return json_response({"id": response_id, "object": "response", "deleted": True})

    async def input_items(self, request: Request) -> HTTPResponse:
        """A stored response's input items, a cursor page (see :mod:`responses_cache.storage.listing`)."""
        try:
            tenant = await self._tenant(request)
            response_id = request.path_params["response_id"]
            query = listing.parse_query(request.query_params, request.query_params.getlist("include[]") or request.query_params.getlist("include"))
            store = self.responder.store
            chain = await store.get_chain(tenant, response_id) if store is not None else None
            if chain is None:  # an earlier link is gone: the response's own input only
                chain = [await self._stored(tenant, response_id)]
            return json_response(listing.page(listing.context_items(chain), query))
        except ResponsesError as exc:
            return error_response(exc)

    async def input_tokens(self, request: Request) -> HTTPResponse:
        """``POST /v1/responses/input_tokens``: the prompt's token count, nothing generated."""
        charge = _Charge(self.input_budget)
        try:
            tenant = await self._tenant(request)
            body = decode_count(await self._body(request, charge, tenant))
            count = await self.responder.count_input_tokens(body, tenant)
        except ResponsesError as exc:
            return error_response(exc)
        except ClientDisconnect:
            return HTTPResponse(status_code=499)
        except Exception:
            logger.exception("POST /responses/input_tokens failed")
            return error_response(server_error())
        finally:
            charge.release()
        return json_response({"object": "response.input_tokens", "input_tokens": count})

    async def compact(self, request: Request) -> HTTPResponse:
        """``POST /v1/responses/compact``: a ``response.compaction`` object (the conversation's
        user messages and one sealed compaction item); nothing stored."""
        charge = _Charge(self.input_budget)
        try:
            self._refuse_if_draining()
            tenant = await self._tenant(request)
            charge.admission = await self._admit(request, tenant)
            body = decode_create(await self._body(request, charge, tenant))
            admission, charge.admission = charge.admission, None
            compacted = await self.responder.compact(body, tenant, admission)
        except ResponsesError as exc:
            return error_response(exc)
        except ClientDisconnect:
            return HTTPResponse(status_code=499)
        except BackendError as exc:
            return error_response(ResponsesError(str(exc), status=500, type="server_error", code=exc.code))
        except Exception:
            logger.exception("POST /responses/compact failed")
            return error_response(server_error())
        finally:
            charge.release()
        return json_response(compacted)

    async def _stored(self, tenant: str, response_id: str) -> StoredResponse:
        stored = await self.responder.store.get(tenant, response_id) if self.responder.store else None
        if stored is None:
            raise listing.not_found(response_id)
        return stored

    async def models(self, request: Request) -> HTTPResponse:
        try:
            await self._tenant(request)
        except ResponsesError as exc:
            return error_response(exc)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "responses-cache"} for m in self.responder.router.models()]
        return json_response({"object": "list", "data": data})


class _EventStream(StreamingResponse):
    """Server-sent events straight from the turn's queue to the socket.

    Starlette's ``StreamingResponse`` watches for a disconnect in an anyio task group per
    request; this response does it with one plain task, and writes every event already queued
    in one chunk. A disconnect cancels the turn (its usage is still billed by the pipeline)."""

    def __init__(self, first: object, queue: asyncio.Queue[object], task: asyncio.Future[ResponseState]) -> None:
        self.first, self.queue, self.task = first, queue, task
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "content-type": "text/event-stream; charset=utf-8"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task, queue = self.task, self.queue
        watcher = asyncio.ensure_future(_cancel_on_disconnect(receive, task))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            item = self.first
            while item is not _DONE:
                chunk = [_frame(item)]
                while not queue.empty():
                    item = queue.get_nowait()
                    if item is _DONE:
                        break
                    chunk.append(_frame(item))
                else:
                    await send({"type": "http.response.body", "body": b"".join(chunk), "more_body": True})
                    item = await queue.get()
                    continue
                await send({"type": "http.response.body", "body": b"".join(chunk), "more_body": True})
            if not task.cancelled():
                await task
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            # The watcher has already cancelled the turn when it saw the disconnect: a second
            # cancellation could cut short the close of the backend's stream (the engine's abort).
            disconnected = watcher.done() and not watcher.cancelled() and watcher.exception() is None
            watcher.cancel()
            if not task.done() and not disconnected:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


class _BackgroundStream(StreamingResponse):
    """Server-sent events of a background response: a disconnect ends this stream only, never
    the response (it runs on; the client may attach again with ``starting_after``)."""

    def __init__(self, frames: AsyncIterator[Frame]) -> None:
        async def body() -> AsyncIterator[bytes]:
            async for frame in frames:
                yield b"event: " + frame.type + b"\ndata: " + frame.data + b"\n\n"

        super().__init__(body(), media_type="text/event-stream; charset=utf-8", headers={"cache-control": "no-cache"})


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Future[ResponseState]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return


def _frame(item: object) -> bytes:
    assert isinstance(item, ev.Event)
    return b"event: " + _type_of(item) + b"\ndata: " + encode(item) + b"\n\n"


_TYPE_CACHE: dict[type, bytes] = {}


def _type_of(event: ev.Event) -> bytes:
    cls = type(event)
    tag = _TYPE_CACHE.get(cls)
    if tag is None:
        tag = str(cls.__struct_config__.tag).encode()
        _TYPE_CACHE[cls] = tag
    return tag


def _too_large(limit: int) -> ResponsesError:
    return ResponsesError(
        f"The request body is larger than the limit of {limit} bytes.", status=413, code="request_too_large"
    )


class _Charge:
    """The bytes one HTTP request has charged to the process-wide input budget, and its quota
    admission until a turn takes it over."""

    def __init__(self, budget: InputBudget | None) -> None:
        self.budget = budget
        self.held = 0
        self.admission: Admission | None = None

    def take(self, size: int) -> None:
        if self.budget is None:
            return
        if not self.budget.take(size):
            raise ResponsesError(
                "The server is holding too much request input; retry shortly.",
                status=429, type="rate_limit_error", code="rate_limit_exceeded",
            )
        self.held += size

    def release(self) -> None:
        if self.budget is not None and self.held:
            self.budget.release(self.held)
        self.held = 0
        if self.admission is not None:  # a turn that ran has released it already (with its usage)
            self.admission.release()
