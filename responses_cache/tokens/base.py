"""The ``Renderer`` protocol and the machinery both templates share.

A renderer turns ``(instructions, tools, items)`` into tokens as an append-only
:class:`~responses_cache.tokens.log.TokenLog`. Subclasses provide the template (header, one item,
the generation prompt, how sampled ids split into items); this module does the bookkeeping:
per-item segments, the call_id -> tool-name lookup, history-rewriting rules, sampled ids, and
the work counters used by the counting tests.

Only the renderer emits special tokens: every piece of text (user content, tool output,
arguments, names) goes through ``encode_ordinary``, so ``"<|end|>"`` typed by a user is plain text.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from abc import ABC, abstractmethod
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar, runtime_checkable

import tiktoken

from ..protocol.items import (
    ContentPart,
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    HostedItem,
    InputFile,
    InputImage,
    InputText,
    Item,
    ItemReference,
    Message,
    OutputText,
    Reasoning,
    Refusal,
)
from ..protocol.tools import CustomTool, GrammarFormat, ToolSet
from .compact import ordinary_encoder
from .errors import UnknownCallError, UnrenderableItemError, UnsupportedContentError
from .log import (
    ANALYSIS,
    JOINED,
    NO_FACTS,
    Facts,
    LogContext,
    Node,
    TokenLog,
    ancestor,
    find_call,
    relayout,
)
from .parsing import OutputParser

T = TypeVar("T")


@dataclass
class RenderStats:
    """Monotonic counters of rendering work actually done (for counting tests and metrics)."""

    #: Token ids produced by rendering (headers and item segments, specials included).
    tokens_encoded: int = 0
    #: Conversation items rendered (tokenized). Items taken from ``sampled`` ids are not counted.
    items_rendered: int = 0
    #: Items whose segment came from sampled ids.
    items_sampled: int = 0
    #: Sampled turns that could not be split one segment per item (kept as one block).
    sampled_unsplit: int = 0
    #: Sampled turns whose ids lacked the template's structure (rendered from the items instead).
    sampled_rejected: int = 0
    #: ``hf``, ``history="keep"``: turns whose ids were kept through a rewrite of the text around
    #: them, because they still spell the template's new text for them (Qwen3's empty thinking
    #: block on the last answer, gone once a message follows it).
    sampled_kept: int = 0
    #: History rewrites (a template rule flipped and nodes were relinked).
    rewinds: int = 0
    #: Nodes relinked by those rewrites (their tokens are reused, not re-encoded).
    items_relinked: int = 0
    #: Turns re-tokenized with the next one because their tokens merge across the boundary (the
    #: ``hf`` renderer, templates without an added token between messages).
    turns_merged: int = 0
    #: ``hf``: turns rendered by running the template over a window of recent items...
    window_renders: int = 0
    #: ...windows whose text for the old items differed from the log's (the whole conversation
    #: was rendered instead)...
    window_misses: int = 0
    #: ...and turns rendered by running the template over the whole conversation.
    full_renders: int = 0
    #: ``hf``: runs of the chat template (a windowed turn runs it once when the window of the
    #: previous turn is reused and the generation prompt is the template's final block).
    template_runs: int = 0
    #: ``hf``: items turned into chat messages for the template (a turn that reuses the window
    #: converts only its own items).
    items_converted: int = 0
    #: ``hf``: encodes of template text done by the verified tiktoken encoder
    #: (:mod:`~.hf_tiktoken`)...
    fast_encodes: int = 0
    #: ...and by the ``tokenizers`` library (the fast path refused for the tokenizer or the text).
    slow_encodes: int = 0


@runtime_checkable
class Renderer(Protocol):
    """What the pipeline needs from a prompt renderer / tokenizer."""

    @property
    def name(self) -> str: ...

    @property
    def stats(self) -> RenderStats: ...

    @property
    def encoding(self) -> tiktoken.Encoding: ...

    @property
    def stop_tokens(self) -> tuple[int, ...]: ...

    @property
    def sampling_stop_tokens(self) -> tuple[int, ...]: ...

    @property
    def generation_prompt(self) -> array[int]: ...

    def output_parser(self, custom_tools: frozenset[str] = frozenset()) -> OutputParser: ...

    def tool_call_prefix(self, name: str | None) -> str: ...

    def end_token(self, tool_call: bool) -> int: ...

    def fingerprint(self, instructions: str | None, tools: ToolSet) -> bytes: ...

    def begin(self, instructions: str | None, tools: ToolSet) -> TokenLog: ...

    def extend(
        self, log: TokenLog, items: Sequence[Item], *, sampled: Sequence[int] | None = None
    ) -> TokenLog: ...

    def prompt(self, log: TokenLog) -> array[int]: ...

    def rewind(self, log: TokenLog, item_index: int) -> TokenLog: ...

    def render_full(
        self, instructions: str | None, tools: ToolSet, items: Sequence[Item]
    ) -> TokenLog: ...

    def encode_text(self, text: str) -> list[int]: ...

    def encode_with_specials(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def count_text(self, text: str) -> int: ...


class Rendered(NamedTuple):
    """One item's segment and what the rewriting rules need to know about it."""

    seg: array[int]
    flags: int
    call_target: str | None = None  # for a function_call: the name its output is addressed from


def item_texts(content: str | list[ContentPart], item_index: int, path: str) -> list[str]:
    """The text of each part of ``content`` (one string per part); media raise an error."""
    if isinstance(content, str):
        return [content]
    texts: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, (InputText, OutputText)):
            texts.append(part.text)
        elif isinstance(part, Refusal):
            texts.append(part.refusal)
        elif isinstance(part, (InputImage, InputFile)):
            raise UnsupportedContentError(
                item_index=item_index,
                part_index=j,
                part_type="input_image" if isinstance(part, InputImage) else "input_file",
                param=f"{path}[{j}]",
            )
    return texts


def custom_tool_description(tool: CustomTool) -> str:
    """A custom tool's description plus its input format, as both templates declare it:
    ``Input: plain text.``, or the grammar (``Input: text matching this lark grammar:`` and the
    definition)."""
    fmt = tool.format
    if isinstance(fmt, GrammarFormat):
        note = f"Input: text matching this {fmt.syntax} grammar:\n{fmt.definition}"
    else:
        note = "Input: plain text."
    return f"{tool.description}\n{note}" if tool.description else note


def reasoning_texts(item: Reasoning) -> list[str]:
    """A reasoning item's text: its ``reasoning_text`` parts, else its summary parts."""
    if item.content:
        return [p.text for p in item.content]
    return [p.text for p in item.summary]


def is_assistant_output(item: Item) -> bool:
    """True for items a model can sample: reasoning, function calls, assistant messages."""
    if isinstance(item, Message):
        return item.role == "assistant"
    return isinstance(item, (Reasoning, FunctionCall, CustomToolCall))


_max_token_bytes: dict[str, int] = {}


def common_prefix_length(a: Sequence[T], b: Sequence[T]) -> int:
    """The length of the longest common prefix of two strings or two id lists (by bisection: each
    step one slice comparison in C, not a Python loop over the elements)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def max_token_bytes(encoding: tiktoken.Encoding) -> int:
    """The longest byte string any token of ``encoding`` stands for (computed once per encoding):
    a text of ``n`` UTF-8 bytes, hence of ``n`` characters or fewer, needs at least ``n / this`` tokens."""
    found = _max_token_bytes.get(encoding.name)
    if found is None:
        found = _max_token_bytes[encoding.name] = max(map(len, encoding.token_byte_values()))
    return found


#: Tokens this long or shorter are not listed by ``longest_token_within`` (it answers at least this).
_SHORT_TOKEN = 8
#: Per encoding: (length, bit mask of the token's distinct bytes) for tokens longer than
#: ``_SHORT_TOKEN``, longest first, one entry per distinct byte set.
_long_tokens: dict[str, list[tuple[int, int]]] = {}
_long_tokens_lock = threading.Lock()
_SAMPLE = 65_536


def longest_token_within(encoding: tiktoken.Encoding, data: bytes) -> int:
    """An upper bound on the length of any token of ``encoding`` made only of bytes that occur in
    ``data``: the longest such token, or ``_SHORT_TOKEN`` when none is longer. A text's tokens are
    substrings of it, so none is longer than this. Costs a few passes over ``data`` in C (finding
    its distinct bytes) and one walk of a per-encoding table built once."""
    present = 0
    rest = data
    while rest:  # each round removes every byte value seen in a sample: at most 256 rounds, usually 1-3
        seen = set(rest[:_SAMPLE])
        for byte in seen:
            present |= 1 << byte
        rest = rest.translate(None, bytes(seen))
    absent = ~present
    for length, mask in _long_token_table(encoding):
        if not mask & absent:
            return length
    return _SHORT_TOKEN


def _long_token_table(encoding: tiktoken.Encoding) -> list[tuple[int, int]]:
    table = _long_tokens.get(encoding.name)
    if table is None:
        with _long_tokens_lock:
            table = _long_tokens.get(encoding.name)
            if table is None:
                longest: dict[int, int] = {}
                for token in encoding.token_byte_values():
                    if len(token) > _SHORT_TOKEN:
                        mask = 0
                        for byte in set(token):
                            mask |= 1 << byte
                        if longest.get(mask, 0) < len(token):
                            longest[mask] = len(token)
                table = sorted(((n, m) for m, n in longest.items()), reverse=True)
                _long_tokens[encoding.name] = table
    return table


class BaseRenderer(ABC):
    """Shared implementation of :class:`Renderer`; subclasses supply the template."""

    #: Template name, e.g. ``"harmony"``.
    template: str = ""
    #: Bump when a template's output changes, so fingerprints of old logs stop matching.
    template_version: int = 1

    def __init__(self, encoding: tiktoken.Encoding, encoding_name: str, options: str) -> None:
        self._encoding = encoding
        self._name = f"{self.template}/{encoding_name}"
        self._stats = RenderStats()
        self._key = hashlib.blake2b(
            f"{self.template}\x00{self.template_version}\x00{encoding_name}\x00{options}".encode(),
            digest_size=16,
        ).digest()
        self._gen_prompt = self._generation_prompt()

    # -- public API ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """``"<template>/<encoding>"``, e.g. ``"harmony/o200k_harmony"``."""
        return self._name

    @property
    def key(self) -> bytes:
        """A digest of template, template version, encoding and options (logs are extendable
        only by a renderer with the same key)."""
        return self._key

    @property
    def stats(self) -> RenderStats:
        """Counters of work done by this renderer instance."""
        return self._stats

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The tiktoken encoding (with this template's special tokens)."""
        return self._encoding

    @property
    def generation_prompt(self) -> array[int]:
        """The tokens :meth:`prompt` appends (a copy)."""
        return array("I", self._gen_prompt)

    def fingerprint(self, instructions: str | None, tools: ToolSet) -> bytes:
        """A digest of template, encoding, options, instructions and tools.

        A cached log can be extended for a new request only if this is unchanged.
        """
        h = hashlib.blake2b(self._key, digest_size=16)
        if instructions:
            h.update(b"\x01")
            h.update(instructions.encode("utf-8", "surrogatepass"))
        else:
            h.update(b"\x00")
        h.update(tools.fingerprint)
        return h.digest()

    def begin(self, instructions: str | None, tools: ToolSet) -> TokenLog:
        """A log holding only the header (system/developer prefix)."""
        seg = self._render_header(instructions or None, tools)
        self._stats.tokens_encoded += len(seg)
        ctx = LogContext(self.name, self._key, self.fingerprint(instructions, tools))
        return TokenLog(Node(None, ctx, seg, 0, NO_FACTS, 0))

    def rewind(self, log: TokenLog, item_index: int) -> TokenLog:
        """The log of the first ``item_index`` items of ``log`` (0: header only), sharing its
        storage. Costs O(items dropped); if the template's rewriting rule differs for the shorter
        conversation (harmony), the affected nodes are relinked without re-tokenizing."""
        if log._node.ctx.key != self._key:
            raise ValueError(f"this log was rendered by {log._node.ctx.name} with other options")
        if not 0 <= item_index <= log.num_items:
            raise IndexError(f"cannot rewind a log of {log.num_items} items to {item_index}")
        node = ancestor(log._node, item_index - 1)
        return TokenLog(relayout(node, self.hidden_before(node.facts), self._stats))

    def extend(
        self, log: TokenLog, items: Sequence[Item], *, sampled: Sequence[int] | None = None
    ) -> TokenLog:
        """``log`` plus one segment per item; ``log``'s storage is shared, not copied.

        With ``sampled``, ``items`` are one assistant turn's output and ``sampled`` the complete
        id stream the model produced for it after :meth:`prompt`'s generation prompt -- the
        template's structural tokens included (harmony: ``<|channel|>…<|message|>…<|end|>
        <|start|>assistant…<|call|>``), not just the ids of the text deltas. Those ids become the
        segments as-is, split at message starts (see the template for its normalizations). Ids
        without the template's structure are detected where the template allows it (harmony) and
        the items are rendered instead (``stats.sampled_rejected``).
        If the template's rewriting rule changes which earlier items are shown, the log is
        relinked from the first affected item (no re-tokenization).
        """
        node = log._node
        if node.ctx.key != self._key:
            raise ValueError(
                f"this log was rendered by {node.ctx.name} with other options; "
                f"{self.name} cannot extend it"
            )
        if not items:
            return log
        rendered = self._from_sampled(items, sampled) if sampled is not None else None
        if rendered is None:
            rendered = self._render_items(node, items)
        facts = node.facts
        all_facts: list[Facts] = []
        start = node.index + 1
        for k, r in enumerate(rendered):
            facts = facts.advance(r.flags, start + k)
            all_facts.append(facts)
        hidden = self.hidden_before(facts)
        node = relayout(node, hidden, self._stats)
        ctx = node.ctx
        for item, r, f in zip(items, rendered, all_facts, strict=True):
            call_id = item.call_id if isinstance(item, (FunctionCall, CustomToolCall)) else None
            # ``r.seg[:]``: an exact-size copy, dropping the slack ``extend`` left (cached memory).
            node = Node(node, ctx, r.seg[:], r.flags, f, hidden, call_id, r.call_target)
        return TokenLog(node)

    def prompt(self, log: TokenLog) -> array[int]:
        """All tokens of ``log`` followed by the generation prompt, as a new ``array('I')``."""
        out = log.tokens()
        out.extend(self._gen_prompt)
        return out

    def render_full(
        self, instructions: str | None, tools: ToolSet, items: Sequence[Item]
    ) -> TokenLog:
        """The reference rendering: header and every item, from scratch."""
        return self.extend(self.begin(instructions, tools), items)

    def encode_text(self, text: str) -> list[int]:
        """Plain-text tokens (special-token look-alikes stay plain text)."""
        return self._encoding.encode_ordinary(text)

    def encode_with_specials(self, text: str) -> list[int]:
        """Tokens of ``text`` with its special tokens recognised (what an engine's ``/tokenize``
        gives for the text: the tokenizer handshake, a tool-call prefill)."""
        return self._encoding.encode(text, allowed_special="all")

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens as their names; invalid UTF-8 replaced)."""
        return self._encoding.decode(list(ids))

    def count_text(self, text: str) -> int:
        """Number of plain-text tokens in ``text``."""
        return len(ordinary_encoder(self._encoding)(text))

    def hidden_before(self, facts: Facts) -> int:
        """Analysis items with an index below this are hidden (0: the template never hides)."""
        return 0

    # -- template hooks ----------------------------------------------------------------------

    @property
    @abstractmethod
    def stop_tokens(self) -> tuple[int, ...]:
        """Token ids that end an assistant turn."""

    @property
    @abstractmethod
    def sampling_stop_tokens(self) -> tuple[int, ...]:
        """The ids to hand an engine as ``stop_token_ids``: where sampling of one turn ends."""

    @abstractmethod
    def output_parser(self, custom_tools: frozenset[str] = frozenset()) -> OutputParser:
        """A parser of this template's sampled text (special tokens visible) into backend
        events; ``custom_tools``: the request's custom tools, whose calls carry plain text."""

    @abstractmethod
    def tool_call_prefix(self, name: str | None) -> str:
        """Text that, appended after the generation prompt, starts a function call (to ``name``,
        or to any function when ``None``): how an engine honours ``tool_choice``."""

    @abstractmethod
    def end_token(self, tool_call: bool) -> int:
        """The stop id that ends a sampled turn (one ending in a tool call when ``tool_call``), to
        put back when an engine leaves it out of the sampled ids."""

    @abstractmethod
    def _generation_prompt(self) -> array[int]:
        """The tokens that open the assistant's next message."""

    @abstractmethod
    def _render_header(self, instructions: str | None, tools: ToolSet) -> array[int]:
        """The header segment for ``instructions`` (None when empty) and ``tools``."""

    @abstractmethod
    def _render_item(self, item: Item, index: int, call_target: str | None) -> Rendered:
        """One item's segment; ``call_target`` is set for a function_call_output."""

    @abstractmethod
    def _call_target(self, item: FunctionCall | CustomToolCall) -> str:
        """The name a tool call's output is addressed from (e.g. ``functions.NAME``)."""

    @abstractmethod
    def _sampled_flags(self, item: Item) -> int:
        """Flags of an assistant-output item whose segment comes from sampled ids."""

    @abstractmethod
    def _finish_sampled(self, seg: array[int], item: Item) -> array[int]:
        """Normalize the last message of a sampled turn (end token, separators)."""

    @property
    @abstractmethod
    def _message_start(self) -> int:
        """The special token that opens every message (where sampled ids are split)."""

    # -- machinery ---------------------------------------------------------------------------

    def _render_items(self, node: Node, items: Sequence[Item]) -> list[Rendered]:
        calls: dict[str, str] = {}
        out: list[Rendered] = []
        encoded = 0
        for i, item in enumerate(items):
            target: str | None = None
            if isinstance(item, (HostedItem, ItemReference)):
                kind = item.type if isinstance(item, HostedItem) else "item_reference"
                raise UnrenderableItemError(item_index=i, item_type=kind, template=self.template)
            if isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
                target = calls.get(item.call_id)
                if target is None:
                    target = find_call(node, item.call_id)
                if target is None:
                    raise UnknownCallError(item_index=i, call_id=item.call_id)
            r = self._render_item(item, i, target)
            if isinstance(item, (FunctionCall, CustomToolCall)):
                r = r._replace(call_target=self._call_target(item))
                calls[item.call_id] = r.call_target  # type: ignore[assignment]
            encoded += len(r.seg)
            out.append(r)
        self._stats.tokens_encoded += encoded
        self._stats.items_rendered += len(items)
        return out

    def _sampled_is_transcript(self, pieces: Sequence[array[int]]) -> bool:
        """Whether sampled ids carry the template's message structure (not just content ids)."""
        return True

    def _from_sampled(self, items: Sequence[Item], sampled: Sequence[int]) -> list[Rendered] | None:
        for i, item in enumerate(items):
            if not is_assistant_output(item):
                raise ValueError(
                    f"sampled ids given, but items[{i}] ({type(item).__name__}) is not "
                    "assistant output"
                )
        full = array("I", self._gen_prompt)
        full.extend(sampled)
        start_tok = self._message_start
        cuts = [0]
        p = len(self._gen_prompt)
        while True:
            try:
                p = full.index(start_tok, p)
            except ValueError:
                break
            cuts.append(p)
            p += 1
        cuts.append(len(full))
        pieces = [full[a:b] for a, b in itertools.pairwise(cuts) if b > a]
        if not self._sampled_is_transcript(pieces):
            self._stats.sampled_rejected += 1
            return None
        targets = [self._call_target(it) if isinstance(it, (FunctionCall, CustomToolCall)) else None for it in items]
        self._stats.items_sampled += len(items)
        if len(pieces) == len(items):
            pieces[-1] = self._finish_sampled(pieces[-1], items[-1])
            return [
                Rendered(seg, self._sampled_flags(item), target)
                for seg, item, target in zip(pieces, items, targets, strict=True)
            ]
        # The ids do not split one message per item: keep the turn as one block on the first
        # item, the other items get empty segments marked JOINED (no cut may fall inside the
        # block). Each item keeps its own FINAL/ASSISTANT flags, so the rewriting rule sees the
        # turn as a full render would (an earlier final inside the block counts); the block is
        # never hidden (no ANALYSIS flag), since part of it cannot be.
        self._stats.sampled_unsplit += 1
        block = self._finish_sampled(full, items[-1])
        out: list[Rendered] = []
        for k, (item, target) in enumerate(zip(items, targets, strict=True)):
            flags = self._sampled_flags(item) & ~ANALYSIS
            out.append(Rendered(block, flags, target) if k == 0 else Rendered(array("I"), flags | JOINED, target))
        return out
