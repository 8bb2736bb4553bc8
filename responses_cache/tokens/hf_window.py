"""The ``hf`` renderer's fast path: running the chat template over a window of recent items.

A jinja template is a function of the whole conversation. :class:`WindowPath` runs it over the
conversation's head (the items up to its first user message, with the instructions and tools)
and the last ``window``-or-more items from a message-group start, certifies that the window's text
for the old items is the end of the log's text, and tokenizes only what the new items add (or,
when they make the template rewrite a turn inside the window, that turn's text again). Where any
of that does not hold it answers None and the renderer runs the template over the whole
conversation. The rules (where a window starts, how far back it reaches, when the previous turn's
window is reused) are in the :mod:`.hf` module docstring.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..protocol.items import Item, Message
from .base import RenderStats, common_prefix_length
from .errors import RenderError
from .hf_encoding import WINDOWS, TemplateEncoder
from .hf_history import HistoryPolicy
from .hf_log import (
    Certificate,
    Header,
    LogWriter,
    Piece,
    kind,
    piece,
    starts_group,
    tail_text,
    text_from_start,
)
from .hf_runner import TemplateRunner
from .log import JOINED, Node, TokenLog, find_call

#: A window is reused while it holds at most this many times the old items a new one would.
_REUSE = 2


@dataclass(frozen=True, slots=True)
class Window:
    """One turn's rendering window over the log ending at ``node`` (whose piece is ``tip``): the
    ``head`` items, then the old items of the ``tail`` nodes (oldest first); ``reused``: the
    previous turn's certificate (:attr:`~.hf_log.Piece.window`) when the window is that turn's."""

    node: Node
    tip: Piece
    head: tuple[Item, ...]
    header: Header
    tail: list[Node]
    reused: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class WindowText:
    """The window's chat ``messages`` with the new items, and the template's text for the window
    alone (``before``), with the new items (``after``) and with the generation prompt (``prompt``)."""

    messages: list[dict[str, Any]]
    before: str
    after: str
    prompt: str


@dataclass(frozen=True, slots=True)
class LogMatch:
    """A window's text for the old items found in the log: the head's text as the window renders
    it, and the end of the log's text (``old_tail``, at least the window's; ``whole``: all of it)."""

    head_text: str
    old_tail: str
    whole: bool


class WindowPath:
    """Renders turns over a window of at least ``window`` recent items: the template through
    ``runner``, template text through ``encoder``, turns kept or tokenized under ``history``,
    added to the log by ``writer``; counts in ``stats``."""

    def __init__(
        self,
        window: int,
        runner: TemplateRunner,
        encoder: TemplateEncoder,
        history: HistoryPolicy,
        writer: LogWriter,
        stats: RenderStats,
    ) -> None:
        self.window = window
        self._runner = runner
        self._encoder = encoder
        self._history = history
        self._writer = writer
        self._stats = stats

    def extend(self, node: Node, items: Sequence[Item], sampled: Sequence[int] | None) -> TokenLog | None:
        """The fast path: run the template over the head (the items up to the first user message)
        and the last ``window``-or-more items, starting at a user message. The window is
        *certified* -- its text for the old items must equal the end of the log's text, and adding
        the new items must only append -- else None (the whole conversation is rendered).

        The previous turn's window is reused while it satisfies this turn's rule (it starts no later
        than this turn's window would, at a window start) and holds at most twice as many old items
        as this turn's window would: its text for the old items is then known (the certificate of
        the previous turn, ``Piece.window``), and the template runs once, over the window and the
        new items, instead of also over the window alone."""
        window = self._choose(node, items)
        if window is None:
            return None
        messages, new_messages = self._window_messages(window, items)
        try:
            before, known = self._window_before(window, messages)
            after, prompt_text = self._runner.render_pair(new_messages, window.header.tools)
        except RenderError:
            return None  # e.g. a template checking alternation by position: render all
        self._stats.window_renders += 1
        text = WindowText(new_messages, before, after, prompt_text)
        match = self._match_log(window, text, known)
        if match is None:
            return None
        if not text.after.startswith(text.before):
            return self._rewrite_window(window, items, text, match)
        return self._append_window(window, items, sampled, text, match)

    def _choose(self, node: Node, items: Sequence[Item]) -> Window | None:
        """This turn's window over the log ending at ``node``: the head and the last
        ``window``-or-more old items from a window start (:meth:`_starts_window`), reaching back
        as :meth:`_reach` says, or the previous turn's window when it can be reused
        (:meth:`_reusable`). None when the whole conversation is rendered: before the first user
        message, when a system or developer message joins, while the conversation is short."""
        tip = piece(node)
        head, header = tip.head, tip.header
        if head is None or header is None:
            return None
        if any(isinstance(item, Message) and item.role in ("system", "developer") for item in items):
            # Templates gather system messages into a header (DeepSeek's, Mistral's): one joining
            # the conversation changes text before the window, which the window cannot see.
            return None
        # A message (a user turn, a final answer) may make the template rewrite what it rendered
        # since the last user message (Qwen3 drops that reasoning, gpt-oss its analysis): then the
        # window reaches back to that user message, so a rewrite shows inside it.
        to_user = any(isinstance(item, Message) for item in items)
        reach = self._reach(node, tip, head, items)
        tail: list[Node] = []
        cur: Node | None = node
        while cur is not None and cur.index >= len(head):
            tail.append(cur)
            if len(tail) >= self.window and cur.index <= reach and self._starts_window(cur, to_user):
                break
            cur = cur.parent
        else:
            return None  # the conversation is still short: render all of it
        extra = self._reusable(node, tip, tail, to_user)
        if extra is not None:
            tail += extra
        tail.reverse()
        return Window(node, tip, head, header, tail, tip.window if extra is not None else None)

    @staticmethod
    def _reach(node: Node, tip: Piece, head: tuple[Item, ...], items: Sequence[Item]) -> int:
        """The index a window must reach back to at least (``node``'s when nothing asks more).

        State a template carries from the first message of a kind (DeepSeek-V3's opens its tool
        outputs block at the conversation's first tool output only, its calls block at the first
        call): the window reaches back to the latest earlier item of each kind the new items
        hold (unless the head has it), so the template is in the same state for the new items;
        and to the latest system or developer message after the head: a template that takes one
        only at the start, or checks the roles' alternation by position (Gemma 3's takes [user,
        system] and refuses [user, system, assistant]), refuses the conversation for it, which a
        window without it would not show."""
        seen = tip.last_seen or {}
        kinds = {kind(i) for i in items} | {"system", "developer"}
        return min((seen[k] for k in kinds if seen.get(k, -1) >= len(head)), default=node.index)

    def _starts_window(self, node: Node, to_user: bool) -> bool:
        """Whether a window may start at ``node``: a message-group start (:func:`~.hf_log.starts_group`),
        and a user message when the new items hold a message (``to_user``)."""
        item = piece(node).item
        return (
            node.parent is not None
            and starts_group(item, node.parent.data)
            and (not to_user or (isinstance(item, Message) and item.role == "user"))
        )

    def _reusable(self, node: Node, tip: Piece, tail: list[Node], to_user: bool) -> list[Node] | None:
        """The nodes the previous turn's window adds before ``tail`` (the new window's nodes, from
        ``node`` back), newest first, when that window reaches at least as far back, is still a
        window start under this turn's rule and is not too long: then it is reused. None when not."""
        if tip.window is None:
            return None
        reused = tip.window[0]
        cur = tail[-1]
        if reused > cur.index or node.index - reused >= _REUSE * len(tail):
            return None
        extra: list[Node] = []
        back = cur.parent
        while back is not None and back.index >= reused:
            extra.append(back)
            back = back.parent
        first = extra[-1] if extra else cur
        return extra if first.index == reused and self._starts_window(first, to_user) else None

    def _window_messages(self, window: Window, items: Sequence[Item]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The chat messages of the window alone (kept from the turn before when it is reused), and
        with the new items."""
        node, header = window.node, window.header

        def lookup(call_id: str) -> str | None:
            return find_call(node, call_id)

        tail_items: list[Item] = [piece(n).item for n in window.tail]  # type: ignore[misc]
        old_items = [*window.head, *tail_items]
        messages = window.tip.messages if window.reused is not None else None
        if messages is None:
            messages = self._runner.messages(header.instructions, old_items, calls=lookup)
        if starts_group(items[0], window.tip):  # the window's last message is complete: add the new ones
            return messages, [*messages, *self._runner.messages(None, items, calls=lookup)]
        return messages, self._runner.messages(header.instructions, [*old_items, *items], first_new=len(old_items), calls=lookup)

    def _window_before(self, window: Window, messages: list[dict[str, Any]]) -> tuple[str, tuple[str, bool] | None]:
        """The template's text for the window alone: known from the previous turn's certificate
        when the window is reused (then also the end of the log's text it was read from, and
        whether that is all of it), else rendered from ``messages``."""
        if window.reused is None:
            return self._runner.render(messages, window.header.tools, False), None
        length = window.reused[1]
        old_tail, whole = tail_text(window.node, length + WINDOWS[0])
        assert window.tip.head_text is not None, "a window is certified with the head's text"
        before = window.tip.head_text + old_tail[len(old_tail) - length :]
        assert len(old_tail) >= length, "a window's text is part of the log's"
        return before, (old_tail, whole)

    def _match_log(self, window: Window, text: WindowText, known: tuple[str, bool] | None) -> LogMatch | None:
        """Certify the window's old items: its text must start with the head's and end with the
        log's text (what ``known`` holds when the window is reused, else read here). None when it
        does not (counted in ``stats.window_misses`` when the log's text differs). Whether the new
        items only append to that text is the caller's to see."""
        before = text.before
        head_text = window.tip.head_text
        if (head_text is None or not before.startswith(head_text)) and window.reused is None:
            head_text = self._head_in_context(window.node, window.tail, before)
        if head_text is None or not before.startswith(head_text):
            return None
        if known is None:
            recent = before[len(head_text) :]
            known = tail_text(window.node, len(recent) + WINDOWS[0])
            if not known[0].endswith(recent):
                self._stats.window_misses += 1
                return None
        return LogMatch(head_text, *known)

    def _append_window(
        self, window: Window, items: Sequence[Item], sampled: Sequence[int] | None, text: WindowText, match: LogMatch
    ) -> TokenLog | None:
        """The log plus the new items' text, tokenized after the end of the log's text, with this
        turn's certificate. None when the tokens would merge across that boundary or the
        generation prompt does not follow it."""
        added = text.after[len(text.before) :]
        old_tail, whole = match.old_tail, match.whole
        ids = self._encoder.after(old_tail, added, whole=whole)
        if ids is None:
            return None
        seg = self._history.keep_sampled(window.tip, added, sampled)
        gen = (
            self._encoder.generation(old_tail + added, old_tail + text.prompt[len(text.before) :], whole=whole)
            if text.prompt.startswith(text.before)
            else None
        )
        if gen is None or gen[1] is None:
            return None
        recent = len(text.before) - len(match.head_text)
        certificate = Certificate((window.tail[0].index, recent + len(added)), match.head_text, text.messages)
        return self._writer.append(window.node, items, added, array("I", ids) if seg is None else seg, gen, certificate)

    def _rewrite_window(self, window: Window, items: Sequence[Item], text: WindowText, match: LogMatch) -> TokenLog | None:
        """The new items make the template rewrite the window's text for old items (Qwen3 writes
        an empty thinking block in its last answer and drops it once a message follows, and drops
        the reasoning after the last user message once a new one comes). As a rendering of the
        whole conversation would (the renderer's full path), the log keeps every turn before the
        rewritten one and the text from that turn's start on is tokenized again (with
        ``history="keep"``, :meth:`~.hf_history.HistoryPolicy.retokenize` keeps the ids of turns that still spell it) --
        taken from the window's own text, without running the template over the whole
        conversation: by the window's rule a template rewrites nothing before the last user
        message, where the window of a turn that adds one starts. None (the whole conversation is
        rendered) when the rewrite reaches back before the window's first turn start."""
        before, after = text.before, text.after
        if not text.prompt.startswith(after):
            return None
        common = common_prefix_length(before, after)
        suffix = 0
        newest_first: list[Node] = []
        for node in reversed(window.tail):
            suffix += len(piece(node).text)
            newest_first.append(node)
            at = len(before) - suffix  # where the node's turn starts in the window's text
            if node.flags & JOINED or at > common:
                continue
            old = match.old_tail[: len(match.old_tail) - suffix]  # the log's text before the turn
            nodes = newest_first[::-1]
            ids = self._history.retokenize(nodes, old, after[at:], whole=match.whole)
            if ids is None:
                continue
            gen = self._encoder.generation(old + after[at:], old + text.prompt[at:], whole=match.whole)
            if gen[1] is None:
                return None
            assert node.parent is not None, "a window holds no header"
            self._stats.rewinds += 1
            window_text = len(after) - len(match.head_text)
            certificate = Certificate((window.tail[0].index, window_text), match.head_text, text.messages)
            turn: list[Item] = [piece(n).item for n in nodes]  # type: ignore[misc]
            return self._writer.append(node.parent, [*turn, *items], after[at:], array("I", ids), gen, certificate)
        return None

    def _head_in_context(self, node: Node, tail: list[Node], before: str) -> str | None:
        """The head's text as the window renders it, when that is not its text alone (Mistral's
        templates write the system prompt into the last user message only): ``before`` less the
        log's text for the window's items, certified as the start of the log's text (the window
        then renders as the log's start followed by the log's end, as with the head's text
        alone). None when the window does not start a turn or that does not hold."""
        if tail[0].flags & JOINED:
            return None
        recent = "".join(piece(n).text for n in tail)
        if not before.endswith(recent):
            return None
        head_text = before[: len(before) - len(recent)]
        return head_text if text_from_start(node, len(head_text)).startswith(head_text) else None
