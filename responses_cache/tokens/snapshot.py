"""Token-log snapshots: what a stored response keeps of its rendered log, and how another
process rebuilds the log from a chain of them without tokenizing anything.

A response's :class:`LogDelta` holds only the segments its own turn added (its input and output
items, with the flags, facts and call data the template's rules need), so a conversation's
snapshot is written once, piece by piece, and never rewritten. A response whose log was rendered
from scratch (first turn, changed instructions or tools) starts a new family: its delta is a
*root* that also holds the header and every item.

:func:`restore` rebuilds the log of a chain of deltas, checked against the renderer's fingerprint
for the chain's instructions and tools: a different template, encoding, options, instructions or
tools gives ``None`` and the caller renders in full. Segments are kept exactly, so token ids the
engine sampled survive the trip (a full render would re-tokenize the output text).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

import msgspec

from .base import BaseRenderer, Renderer
from .log import NO_FACTS, Facts, LogContext, Node, TokenLog, ancestor


class Segment(msgspec.Struct, array_like=True, frozen=True):
    """One item's tokens (uint32, little-endian) and what the rewriting rules need."""

    tokens: bytes
    flags: int
    facts: tuple[int, int, bool]
    call_id: str | None = None
    call_target: str | None = None


class LogDelta(msgspec.Struct, array_like=True, frozen=True):
    #: Renderer fingerprint (template, encoding, options, instructions, tools) of the log.
    fingerprint: bytes
    #: Index of the first item in ``segments`` (0 for a root).
    start: int
    segments: tuple[Segment, ...]
    #: The header's tokens: set on a root delta only.
    header: bytes | None = None

    @property
    def root(self) -> bool:
        return self.header is not None

    @property
    def nbytes(self) -> int:
        return len(self.header or b"") + sum(len(s.tokens) for s in self.segments)


def _pack(seg: array[int]) -> bytes:
    if sys.byteorder == "big":  # pragma: no cover - little-endian on every platform we ship
        seg = array("I", seg)
        seg.byteswap()
    return seg.tobytes()


def _unpack(data: bytes) -> array[int]:
    seg = array("I")
    seg.frombytes(data)
    if sys.byteorder == "big":  # pragma: no cover
        seg.byteswap()
    return seg


def delta(log: TokenLog, since: int | None) -> LogDelta:
    """The segments of ``log``'s items from index ``since`` on (``None``: a root delta, with the
    header and every item). ``since`` is the item count of the log this one extended."""
    tip = log._node
    start = 0 if since is None else since
    nodes: list[Node] = []
    node: Node | None = tip
    while node is not None and node.index >= start:
        nodes.append(node)
        node = node.parent
    nodes.reverse()
    segments = tuple(
        Segment(_pack(n.seg), n.flags, (n.facts.first_final, n.facts.first_analysis, n.facts.last_assistant_final),
                n.call_id, n.call_target)
        for n in nodes
    )
    header = _pack(ancestor(tip, -1).seg) if since is None else None
    return LogDelta(tip.ctx.fingerprint, start, segments, header)


def restore(renderer: Renderer, fingerprint: bytes, deltas: Sequence[LogDelta | None]) -> TokenLog | None:
    """The log of a chain whose responses kept ``deltas`` (oldest first), or ``None`` when it
    cannot be rebuilt exactly: a missing delta after the last root, a gap, or a fingerprint other
    than ``fingerprint`` (what ``renderer`` gives for the chain's current instructions and tools)."""
    if not isinstance(renderer, BaseRenderer) or not deltas:
        return None
    first = len(deltas) - 1
    while first >= 0:
        d = deltas[first]
        if d is None or d.fingerprint != fingerprint:
            return None
        if d.root:
            break
        first -= 1
    if first < 0:
        return None
    segments: list[Segment] = []
    for d in deltas[first:]:
        assert d is not None
        if d.start != len(segments):
            return None
        segments.extend(d.segments)
    root = deltas[first]
    assert root is not None and root.header is not None
    last = segments[-1].facts if segments else None
    facts = Facts(*last) if last is not None else NO_FACTS
    # A template's history rule depends only on the facts at the tip: building every node under
    # the tip's rule gives the same visible tokens the original log had after its relinks.
    hidden = renderer.hidden_before(facts)
    ctx = LogContext(renderer.name, renderer.key, fingerprint)
    node = Node(None, ctx, _unpack(root.header), 0, NO_FACTS, 0)
    for s in segments:
        node = Node(node, ctx, _unpack(s.tokens), s.flags, Facts(*s.facts), hidden, s.call_id, s.call_target)
    return TokenLog(node)
