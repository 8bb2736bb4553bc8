"""The append-only rendered-token log.

A :class:`TokenLog` is an immutable, persistent linked list of *segments*: one root segment with
the header (system/developer prefix), then one segment per conversation item. Extending a log
creates new nodes that point at the old tip, so a child shares all of its parent's token storage,
forks (two children of one parent) share everything up to the fork, and rewinding to an item
boundary just returns an ancestor node. Each segment's tokens are a compact ``array('I')``.

Templates that rewrite history (harmony hides earlier ``analysis`` messages once a final answer
exists) keep the tokens of every item and only toggle a *visible* flag: when the rule flips,
:func:`relayout` relinks the nodes from the first affected item onward, reusing their arrays, so
nothing is re-tokenized and the token data is never copied.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .base import RenderStats

#: Item flags (what the item is, for history-rewriting rules).
ANALYSIS = 1  # an assistant reasoning / ``analysis`` message
ASSISTANT = 2  # any message authored by the assistant
FINAL = 4  # an assistant message on the ``final`` channel
JOINED = 8  # no tokens of its own: they are in an earlier item's block (an unsplittable sampled turn)

_EMPTY = array("I")
_COMPARE_CHUNK = 512


class Facts(NamedTuple):
    """Facts about the items of a prefix that rewriting rules depend on (-1: none yet)."""

    first_final: int
    first_analysis: int
    last_assistant_final: bool

    def advance(self, flags: int, index: int) -> Facts:
        """The facts after appending an item with ``flags`` at position ``index``."""
        first_final, first_analysis, last_final = self
        if flags & FINAL and first_final < 0:
            first_final = index
        if flags & ANALYSIS and first_analysis < 0:
            first_analysis = index
        if flags & ASSISTANT:
            last_final = bool(flags & FINAL)
        if (first_final, first_analysis, last_final) == self:
            return self
        return Facts(first_final, first_analysis, last_final)


NO_FACTS = Facts(-1, -1, False)


@dataclass(frozen=True, eq=False)
class LogContext:
    """Shared by every node of one log family: who rendered it and for which header."""

    name: str  # the renderer's name (for messages)
    key: bytes  # the renderer's configuration key (template, encoding, options)
    fingerprint: bytes  # renderer.fingerprint(instructions, tools) of the header


class Node:
    """One segment: the header (index -1) or one conversation item."""

    __slots__ = (
        "call_id",
        "call_target",
        "ctx",
        "data",
        "facts",
        "flags",
        "hidden_before",
        "index",
        "parent",
        "seg",
        "total",
        "visible",
    )

    def __init__(
        self,
        parent: Node | None,
        ctx: LogContext,
        seg: array[int],
        flags: int,
        facts: Facts,
        hidden_before: int,
        call_id: str | None = None,
        call_target: str | None = None,
        data: object = None,
    ) -> None:
        self.parent: Node | None = parent
        self.ctx: LogContext = ctx
        self.index: int = -1 if parent is None else parent.index + 1
        self.seg = seg
        self.flags = flags
        self.facts = facts
        #: Analysis items with an index below this are hidden in this node's chain.
        self.hidden_before = hidden_before
        self.visible = not (flags & ANALYSIS and self.index < hidden_before)
        #: Visible tokens from the header up to and including this node.
        self.total: int = (0 if parent is None else parent.total) + (len(seg) if self.visible else 0)
        self.call_id = call_id
        self.call_target = call_target
        #: What a renderer keeps with the segment to extend the log later (the ``hf`` renderer:
        #: the item and the template text it added); ``None`` for the built-in templates.
        self.data = data

    def relinked(self, parent: Node, hidden_before: int) -> Node:
        """A copy of this node (same token array) under a new parent and hiding rule."""
        return Node(
            parent,
            self.ctx,
            self.seg,
            self.flags,
            self.facts,
            hidden_before,
            self.call_id,
            self.call_target,
            self.data,
        )


def ancestor(node: Node, index: int) -> Node:
    """The node at item ``index`` (``-1``: the header) on ``node``'s chain."""
    if index > node.index or index < -1:
        raise IndexError(f"item index {index} out of range for a log of {node.index + 1} items")
    while node.index > index:
        assert node.parent is not None
        node = node.parent
    return node


def find_call(node: Node, call_id: str) -> str | None:
    """The target of the latest ``function_call`` with ``call_id`` on the chain, if any."""
    cur: Node | None = node
    while cur is not None:
        if cur.call_id == call_id:
            return cur.call_target
        cur = cur.parent
    return None


def relayout(node: Node, hidden_before: int, stats: RenderStats) -> Node:
    """``node``'s chain with analysis items below ``hidden_before`` hidden (relinks if needed).

    Only the nodes from the first item whose visibility changes onward are recreated; their token
    arrays are reused, so the cost is O(items relinked), with no tokenization.
    """
    n = node.index + 1
    old = min(node.hidden_before, n)
    new = min(hidden_before, n)
    if old == new:
        return node
    lo, hi = min(old, new), max(old, new)
    first = node.facts.first_analysis
    if first < 0 or first >= hi:
        return node  # no analysis item in the affected range: the tokens are the same
    chain: list[Node] = []
    cur = node
    if first >= lo:
        while cur.index >= first:
            chain.append(cur)
            assert cur.parent is not None
            cur = cur.parent
    else:  # general case: find the first analysis item at or after ``lo``
        while cur.index >= lo:
            chain.append(cur)
            assert cur.parent is not None
            cur = cur.parent
        while chain and not (chain[-1].flags & ANALYSIS and chain[-1].index < hi):
            cur = chain.pop()
        if not chain:
            return node
    stats.rewinds += 1
    stats.items_relinked += len(chain)
    for old_node in reversed(chain):
        cur = old_node.relinked(cur, hidden_before)
    return cur


def _segments(node: Node, stop: Node | None = None) -> list[array[int]]:
    """Visible, non-empty segments from just after ``stop`` (or the start) to ``node``, in order."""
    segs: list[array[int]] = []
    cur: Node | None = node
    while cur is not None and cur is not stop:
        if cur.visible and cur.seg:
            segs.append(cur.seg)
        cur = cur.parent
    segs.reverse()
    return segs


def _matching(xs: Sequence[array[int]], ys: Sequence[array[int]]) -> int:
    """Length of the common prefix of the concatenations of ``xs`` and ``ys``."""
    i = j = oa = ob = 0
    total = 0
    while i < len(xs) and j < len(ys):
        x, y = xs[i], ys[j]
        if x is y and oa == ob:
            step = len(x) - oa
        else:
            step = min(len(x) - oa, len(y) - ob)
            if x[oa : oa + step] != y[ob : ob + step]:
                k = 0
                while k < step:
                    m = min(_COMPARE_CHUNK, step - k)
                    if x[oa + k : oa + k + m] != y[ob + k : ob + k + m]:
                        while x[oa + k] == y[ob + k]:
                            k += 1
                        return total + k
                    k += m
        total += step
        oa += step
        ob += step
        if oa == len(x):
            i, oa = i + 1, 0
        if ob == len(y):
            j, ob = j + 1, 0
    return total


class TokenLog:
    """An immutable, persistent rendered-token log (header + one segment per item).

    Build one with ``Renderer.begin`` / ``Renderer.extend`` / ``Renderer.render_full``.
    """

    __slots__ = ("_node",)

    def __init__(self, node: Node) -> None:
        self._node = node

    @property
    def num_tokens(self) -> int:
        """Number of tokens in the log (header and items; without the generation prompt)."""
        return self._node.total

    @property
    def num_items(self) -> int:
        """Number of conversation items rendered after the header."""
        return self._node.index + 1

    @property
    def header_tokens(self) -> int:
        """Number of tokens of the header (system/developer prefix)."""
        return ancestor(self._node, -1).total

    @property
    def fingerprint(self) -> bytes:
        """The renderer fingerprint (instructions + tools + template) this log was begun with."""
        return self._node.ctx.fingerprint

    @property
    def renderer_name(self) -> str:
        """Name of the renderer that produced this log."""
        return self._node.ctx.name

    def tokens(self) -> array[int]:
        """All tokens of the log as one new ``array('I')`` (O(total) copy)."""
        out = array("I")
        for seg in _segments(self._node):
            out.extend(seg)
        return out

    def item_tokens(self, index: int) -> array[int]:
        """The tokens item ``index`` contributes now (empty when a template hides it)."""
        if not 0 <= index <= self._node.index:
            raise IndexError(f"item index {index} out of range for a log of {self.num_items} items")
        node = ancestor(self._node, index)
        return array("I", node.seg) if node.visible else array("I")

    def item_hidden(self, index: int) -> bool:
        """True when the template currently hides item ``index`` (harmony's dropped analysis)."""
        if not 0 <= index <= self._node.index:
            raise IndexError(f"item index {index} out of range for a log of {self.num_items} items")
        return not ancestor(self._node, index).visible

    def splits_at(self, item_index: int) -> bool:
        """True when the log can be cut before item ``item_index`` (:meth:`rewind`): the first
        ``item_index`` items hold all of their tokens, no unsplittable sampled block spans the cut."""
        if not 0 <= item_index <= self.num_items:
            raise IndexError(f"item index {item_index} out of range for a log of {self.num_items} items")
        if item_index == self.num_items:
            return True
        return not ancestor(self._node, item_index).flags & JOINED

    def item_ends(self) -> list[int]:
        """For each item, the log's visible tokens up to and including it (header included), as
        the log shows them now: ``item_ends()[i] - item_ends()[i - 1]`` is item ``i``'s size.
        O(items), no token copied (what truncation measures the conversation with)."""
        ends: list[int] = []
        node: Node | None = self._node
        while node is not None and node.index >= 0:
            ends.append(node.total)
            node = node.parent
        ends.reverse()
        return ends

    def iter_segments(self) -> Iterator[array[int]]:
        """The visible segments in order, without copying (read-only by convention)."""
        return iter(_segments(self._node))

    def common_prefix(self, other: TokenLog) -> int:
        """Number of leading tokens this log shares with ``other``.

        Walks back to the nodes the two logs share and compares only the tokens after them, so
        for a child and its parent the cost is O(items appended), not O(history).
        """
        a, b = self._node, other._node
        if a is b:
            return a.total
        tail_a: list[Node] = []
        tail_b: list[Node] = []
        while a.index > b.index:
            tail_a.append(a)
            a = a.parent  # type: ignore[assignment]
        while b.index > a.index:
            tail_b.append(b)
            b = b.parent  # type: ignore[assignment]
        lca: Node | None = a
        while a is not b:
            tail_a.append(a)
            tail_b.append(b)
            if a.parent is None or b.parent is None:
                lca = None
                break
            a, b = a.parent, b.parent
        else:
            lca = a
        base = 0 if lca is None else lca.total
        if not tail_a:
            return self._node.total
        if not tail_b:
            return other._node.total
        xs = [n.seg for n in reversed(tail_a) if n.visible and n.seg]
        ys = [n.seg for n in reversed(tail_b) if n.visible and n.seg]
        return base + _matching(xs, ys)

    def __len__(self) -> int:
        return self._node.total

    def __repr__(self) -> str:
        return (
            f"TokenLog({self.renderer_name}, items={self.num_items}, tokens={self.num_tokens})"
        )
