"""What a finished response leaves behind: the child state a continuation starts from, where
its conversation starts in the client's, and the record the response store keeps."""

from __future__ import annotations

import dataclasses

import msgspec

from ..backends.routing import Route
from ..protocol.codec import encode
from ..protocol.items import Item
from ..protocol.response import Response
from ..storage.state import ResponseState, open_calls_after
from ..storage.store import StoredResponse
from ..tokens.log import TokenLog
from ..tokens.snapshot import delta
from .admit import Admitted, Continuation
from .progress import Progress
from .render import RenderedPrompt, extend_with_output
from .turn import Lineage, Turn


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """A finished response as the persistence steps see it: what its input continued, the input
    the hooks let through, how it progressed, and the final response object."""

    after: Continuation
    admitted: Admitted
    progress: Progress
    final: Response
    #: After the input: the output, with any appended tool outputs where they came.
    after_input: list[Item]


def child_state(turn: Turn, lineage: Lineage, route: Route, outcome: Outcome, conversation_key: str) -> ResponseState:
    """The state a continuation of this response starts from: it shares everything it can
    with its parent (the conversation, the token log extended by the output)."""
    progress, parent = outcome.progress, lineage.parent
    rendered, out = progress.rendered, progress.out
    log = None
    if rendered is not None and route.renderer is not None and progress.status != "failed":
        log = extend_with_output(
            route.renderer, rendered.log, out.output[progress.round_start :],
            progress.finish.token_ids if progress.finish else None,
        )
    base, after_input, admitted = progress.base, outcome.after_input, outcome.admitted
    own_items: list[Item] = [*admitted.items, *after_input]
    return ResponseState(
        response=outcome.final,
        tenant=turn.tenant,
        lane=turn.lane,
        conversation=progress.context.extend(out.output[progress.round_start :]),
        instructions=turn.request.instructions,
        tools=turn.tools,
        fingerprint=rendered.fingerprint if rendered else None,
        token_log=log,
        route=route,
        open_calls=open_calls_after(admitted.open_calls if base is None else open_calls_after({}, base), after_input),
        hook_state={**progress.hook_state, **progress.alongside_state},
        conversation_key=conversation_key,
        total_bytes=(
            (parent.total_bytes if parent else 0) + sum(len(encode(i)) for i in own_items)
            if base is None
            else sum(len(encode(i)) for i in (*base, *after_input))
        ),
        **client_view(parent, outcome.after, progress.truncated, base),
    )


def client_view(
    parent: ResponseState | None, after: Continuation, truncated: RenderedPrompt | None, base: list[Item] | None
) -> dict[str, int]:
    """Where the child's conversation starts in the client's (see ``ResponseState.client_offset``):
    the parent's, moved on by a cut; reset by a compaction (its item is where a resend is
    matched from)."""
    offset, ahead = (parent.client_offset, parent.kept_ahead) if parent is not None and after.base is None else (0, 0)
    if truncated is not None:
        offset += truncated.dropped_items + truncated.kept_ahead - ahead
        ahead = truncated.kept_ahead
    elif base is not None:
        offset = ahead = 0
    return {"client_offset": offset, "kept_ahead": ahead}


def stored_response(turn: Turn, lineage: Lineage, outcome: Outcome, log: TokenLog | None, snapshots: bool) -> StoredResponse:
    """The record ``store: true`` keeps: its input, its output with any appended tool outputs
    where they came, and (``snapshots``) the token-log segments this turn added."""
    progress, parent = outcome.progress, lineage.parent
    rendered, out, items = progress.rendered, progress.out, outcome.admitted.items
    # A full-input request matched against the cache has no previous_response_id: store the
    # whole input it carried (the reused prefix too), or hydrating it would lose that prefix.
    stored_input = (*outcome.after.context.items(), *items) if lineage.reused_items else tuple(items)
    snapshot = None
    if log is not None and rendered is not None and snapshots:
        # The segments this turn added; a root (header and every item) when the log was
        # rendered from scratch or this response starts its own stored chain.
        since = None
        if rendered.incremental and not lineage.reused_items and parent is not None and parent.token_log is not None:
            since = parent.token_log.num_items
        snapshot = delta(log, since)
    # A response that took appends is stored with them in its output, where they came, so
    # that a continuation hydrated from the store sees the conversation the model saw.
    # (An automatic compaction's item stays first, where the client saw it.)
    final = outcome.final
    stored = (
        msgspec.structs.replace(final, output=[*out.output[: progress.first_output], *outcome.after_input])
        if progress.round_start != progress.first_output
        else final
    )
    return StoredResponse(turn.tenant, stored, stored_input, turn.request.instructions, turn.tools.raw, snapshot)
