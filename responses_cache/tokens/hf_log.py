"""What the ``hf`` renderer keeps on its token-log nodes, and how a turn is added to a log.

Each node of an ``hf`` log carries a :class:`Piece`: its item, the template text its segment
stands for, and on the last node of a turn what the next turn needs (the generation prompt, the
conversation's head, the certificate of a rendering window, :mod:`.hf_window`). :class:`LogWriter`
appends one turn to a log; the functions read a log's nodes and text.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
)
from .base import is_assistant_output
from .errors import RenderError
from .hf_encoding import Generation
from .hf_messages import qualified
from .hf_runner import TemplateRunner
from .log import JOINED, NO_FACTS, Node, TokenLog


@dataclass(frozen=True, slots=True)
class Header:
    """The request's instructions and tools as the template gets them."""

    instructions: str | None
    tools: list[dict[str, Any]] | None


@dataclass(slots=True)
class Piece:
    """What an ``hf`` log node keeps: its item, the template text its segment stands for (the
    first node of a turn holds the turn's text, the others ``""``), and on the last node of a turn
    the tokens of the generation prompt that follows it."""

    item: Item | None
    text: str
    header: Header | None = None
    #: The conversation's items up to and including its first user message (None before one),
    #: and the template's text for them, the fixed start of every rendering window: always the
    #: start of the log's text (their text alone when it is, else as a window certified it; None
    #: until one does).
    head: tuple[Item, ...] | None = None
    head_text: str | None = ""
    gen_text: str | None = None
    gen: array[int] | None = None
    #: Set when the template's prompt is not "log + generation prompt": the whole prompt.
    whole_prompt: array[int] | None = None
    #: On the last node of a turn taken by the window path: the index of the first item of its
    #: window and the length of the window's text after the head's, a certified fact -- the
    #: template's text for the head and the items from that index to this node is the head's text
    #: followed by the last that-many characters of the log's text -- so the next turn can reuse
    #: the window without running the template over it again.
    window: tuple[int, int] | None = None
    #: On the last node of a turn: the index of the latest item of each kind (:func:`kind`) up
    #: to it; a rendering window reaches back to the latest earlier item of each kind the new
    #: items hold.
    last_seen: Mapping[str, int] | None = None
    #: With ``window``: the chat messages the template got for the head, the window's items and
    #: this turn's (never changed once built), so that a turn reusing the window converts only its
    #: own items.
    messages: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class Certificate:
    """What a turn taken by the window path certified, kept on its last node
    (:attr:`Piece.window`, :attr:`Piece.head_text`, :attr:`Piece.messages`)."""

    window: tuple[int, int]
    head_text: str
    messages: list[dict[str, Any]]


def piece(node: Node) -> Piece:
    """``node``'s piece; ``ValueError`` for a log another renderer made."""
    found = node.data
    if not isinstance(found, Piece):
        raise ValueError("this log was not rendered by an hf renderer")
    return found


def chain(node: Node) -> list[Node]:
    """The nodes from the header to ``node``."""
    nodes: list[Node] = []
    cur: Node | None = node
    while cur is not None:
        nodes.append(cur)
        cur = cur.parent
    nodes.reverse()
    return nodes


def text_from_start(node: Node, chars: int | None = None) -> str:
    """The start of the log's text, at least ``chars`` long (all of it by default)."""
    parts: list[str] = []
    total = 0
    for n in chain(node):
        if chars is not None and total >= chars:
            break
        parts.append(piece(n).text)
        total += len(parts[-1])
    return "".join(parts)


def tail_text(node: Node, chars: int) -> tuple[str, bool]:
    """The end of the log's text, at least ``chars`` long (or all of it: then True)."""
    parts: list[str] = []
    total = 0
    cur: Node | None = node
    while cur is not None and total < chars:
        text = piece(cur).text
        parts.append(text)
        total += len(text)
        cur = cur.parent
    parts.reverse()
    return "".join(parts), cur is None


def starts_group(item: Item | None, before: object) -> bool:
    """Whether ``item`` starts a new group of chat messages (a user or system message, the first
    assistant-output item after other items, the first tool output after other items): where a
    rendering window may begin."""
    previous = before.item if isinstance(before, Piece) else None
    if item is None or previous is None:
        return False
    if isinstance(item, Message) and item.role != "assistant":
        return True
    if is_assistant_output(item):
        return not is_assistant_output(previous)
    return isinstance(item, (FunctionCallOutput, CustomToolCallOutput)) and not isinstance(
        previous, (FunctionCallOutput, CustomToolCallOutput)
    )


def kind(item: Item | None) -> str:
    """The kind of chat-message content ``item`` becomes, for :attr:`Piece.last_seen`."""
    if isinstance(item, Message):
        return item.role
    if isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
        return "output"
    if isinstance(item, (FunctionCall, CustomToolCall)):
        return "call"
    return type(item).__name__


class LogWriter:
    """Adds turns to ``hf`` logs; runs the template (``runner``) for a conversation's head."""

    def __init__(self, runner: TemplateRunner) -> None:
        self._runner = runner

    def append(
        self,
        node: Node,
        items: Sequence[Item],
        text: str,
        seg: array[int],
        gen: Generation,
        certificate: Certificate | None = None,
    ) -> TokenLog:
        """``node`` plus one turn: the first item's node holds ``seg`` and ``text``, the others are
        ``JOINED``; the last one holds the generation prompt ``gen`` (and the window path's
        ``certificate``: its window, the head's text in the window when it is not the parent's,
        and the window's messages)."""
        ctx = node.ctx
        parent = piece(node)
        header = parent.header
        head, head_text = parent.head, parent.head_text if certificate is None else certificate.head_text
        if head is None and any(isinstance(i, Message) and i.role == "user" for i in items):
            head, head_text = self._head(node, items, header)
            if not (text_from_start(node) + text).startswith(head_text):
                head_text = None  # rendered otherwise when followed: a window certifies it
        last = len(items) - 1
        seen = {**(parent.last_seen or {}), **{kind(item): node.index + 1 + k for k, item in enumerate(items)}}
        for k, item in enumerate(items):
            call_id = target = None
            if isinstance(item, (FunctionCall, CustomToolCall)):
                call_id, target = item.call_id, qualified(item.namespace, item.name)
            new = Piece(item, text if k == 0 else "", header, head, head_text)
            if k == last:
                new.gen_text, new.gen, new.whole_prompt = gen
                new.last_seen = seen
                if certificate is not None:
                    new.window, new.messages = certificate.window, certificate.messages
            node = Node(node, ctx, seg if k == 0 else array("I"), JOINED if k else 0, NO_FACTS, 0, call_id, target, new)
        return TokenLog(node)

    def _head(self, node: Node, items: Sequence[Item], header: Header | None) -> tuple[tuple[Item, ...] | None, str]:
        """The items up to and including the first user message, and the template's text for them."""
        assert header is not None
        found: list[Item] = [piece(n).item for n in chain(node)[1:]]  # type: ignore[misc]
        for item in items:
            found.append(item)
            if isinstance(item, Message) and item.role == "user":
                break
        try:
            text = self._runner.render(self._runner.messages(header.instructions, found), header.tools, False)
        except RenderError:
            return None, ""
        return tuple(found), text
