"""The ``hf`` renderer: any model with a Hugging Face ``tokenizer.json`` and chat template.

``get_renderer("hf:/path/to/model")`` renders conversations with the model's own chat template
(see :mod:`.hf_files` for how it is read and compiled, :mod:`.hf_messages` for the item ->
message mapping) and tokenizes with the model's own tokenizer (the ``tokenizers`` library, or a
tiktoken encoder built from the same ``tokenizer.json`` where its ids provably equal it, see
:mod:`.hf_tiktoken`), so the prompt equals ``transformers.apply_chat_template(messages, tools=…,
tokenize=True)`` and what an engine's chat endpoint computes for the same messages.

Incremental rendering. A jinja template is a function of the whole conversation; running it over
a long history every turn would cost O(messages). Each turn instead:

* **renders a window**: the template runs over the *head* (the items up to and including the first
  user message, with the instructions and tools) and the last ``window`` or more items, from a
  message-group start (a user or system message, the first assistant item or tool output after
  other items) -- once with the new items; the same run gives the text with the generation prompt
  when the template's only use of ``add_generation_prompt`` is its final ``{% if %}`` block
  (checked on its syntax tree, :class:`~.hf_files.ChatTemplate`; otherwise it runs twice).
  When the new items hold a message (a user turn, an answer), the window starts at the last user
  message, because templates rewrite what follows it (Qwen3 drops that reasoning, gpt-oss its
  analysis); a tool step (outputs, reasoning, calls) needs only the last few items. The window
  also reaches back to the latest earlier item of each kind the new items hold (unless the head
  has one): templates keep state only the first item of a kind sets (DeepSeek-V3 opens its tool
  outputs block at the conversation's first output), and to the latest system or developer
  message after the head (templates checking roles by position refuse what follows one). A turn
  that adds a system or developer message renders the whole conversation (templates gather those
  into a header before the window);
* **certifies the window**: its text for the old items (after the head's) must equal the end of
  the log's text, and adding the new items must only append to it, or rewrite only text from a
  turn start inside the window on (Qwen3's last answer loses its empty thinking block once a
  message follows it, its reasoning once a user message does: the window of a turn adding a
  message starts at the last user message, so such rewrites show inside it), which is then
  tokenized again from that turn's start, as a whole rendering would be; otherwise (a short
  conversation, a rewrite before the window, a window that renders the old items differently) the
  template runs over the whole conversation, exactly as ``apply_chat_template`` would. The text
  of the window without the new items is known when the previous turn used the same window (its
  certificate, kept on the log as the window's start and length): the window is kept while it
  still satisfies this turn's rule and holds at most twice the items a fresh one would, so a tool
  step runs the template once, not also over the old window (and converts only its own items to
  chat messages: the window's are kept with the certificate);
* **tokenizes only the new text**, starting at the last added token (special or not) of the old
  text: the tokenizer splits added tokens out before anything else, so nothing merges across
  that boundary; the few tokens between it and the end of the old text are re-encoded and must
  come out unchanged (checked). A template without an added token between messages merges the
  last turn's text with the new one's: that turn is tokenized again with the new items;
* stores the new tokens as one segment for the turn's items (the first item holds them, the
  others are ``JOINED``), with the items and text, so the next turn can run the template again.

The window assumes what the certificate cannot see: that a template rewrites nothing before the
last user message, and that state carried from before the window into the new items only does
not change their text beyond what the window's own items of those kinds show (a counter of
earlier outputs shows in the window's outputs, which the certificate compares); the head keeps
"first user message" and system-prompt rules exact. ``window=None`` runs the template over the whole
conversation every turn (exact for any template, O(messages) of template work per turn).

History rewrites. Some templates change what they rendered for earlier messages: Qwen3 drops the
reasoning of assistant turns once a later user message exists, a tool message closes a block that
the next tool message reopens, a date in a system header changes, a new system message joins the
header. The prefix check detects every such case, and ``history`` decides:

``"template"`` (default)
    Follow the template: the conversation is tokenized again from the start of the first turn
    the template rewrote (earlier turns keep their tokens), so the prompt always equals the template's rendering of the messages -- exactly what the
    engine's own chat endpoint would build. Sampled ids are not kept (the output items are
    rendered), for the same reason.
``"keep"``
    Keep the token log as sampled: an assistant turn's segment is the generation prompt plus the
    ids the model sampled (its end token, then the text the template puts after that token), and
    later turns append the template's text for the new items. When the template rewrites its own
    earlier text, the turns whose ids still spell the template's new text keep them (Qwen3 writes
    an empty thinking block in its last answer and drops it once a message follows: the model
    never sampled it, so the prompt is still the log plus the new turn, as a client sending token
    ids straight to the engine would send, and the engine's prefix cache serves the whole
    answer); from the first turn that does not (reasoning a template drops), there is no
    log-preserving prompt it describes, so ``keep`` follows the template, like ``"template"``.

Both count a rewrite in ``stats.rewinds``; no other prompt is ever sent.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import tiktoken

from ..protocol.items import (
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
)
from ..protocol.tools import ToolSet, parse_tools
from .base import RenderStats, common_prefix_length, is_assistant_output
from .errors import RenderError
from .hf_files import ModelFiles, compile_template, load_model_files
from .hf_messages import chat_messages, chat_tools, parse_arguments, qualified, template_view
from .hf_parsing import detect_format, family_parser, tool_call_prefix
from .hf_tiktoken import FastEncoder, Refused, byte_decoder, fast_encoder, literals_pattern
from .log import JOINED, NO_FACTS, LogContext, Node, TokenLog, ancestor, find_call
from .parsing import OutputParser, opens_think

if TYPE_CHECKING:
    from tokenizers import Tokenizer

logger = logging.getLogger("responses_cache.tokens")

History = Literal["template", "keep"]

#: Tokens that end an assistant turn in the families we know, when the vocabulary has them.
_END_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<｜end▁of▁sentence｜>",
    "</s>",
    "<|end|>",
)
#: Windows of the old text searched for its last added token (then all of it).
_WINDOWS = (2048, 65536)
#: Parsed call arguments kept per renderer (by their text).
_PARSED = 4096
#: A window is reused while it holds at most this many times the old items a new one would.
_REUSE = 2


def _starts_group(item: Item | None, before: object) -> bool:
    """Whether ``item`` starts a new group of chat messages (a user or system message, the first
    assistant-output item after other items, the first tool output after other items): where a
    rendering window may begin."""
    previous = before.item if isinstance(before, _Piece) else None
    if item is None or previous is None:
        return False
    if isinstance(item, Message) and item.role != "assistant":
        return True
    if is_assistant_output(item):
        return not is_assistant_output(previous)
    return isinstance(item, (FunctionCallOutput, CustomToolCallOutput)) and not isinstance(
        previous, (FunctionCallOutput, CustomToolCallOutput)
    )


def _kind(item: Item | None) -> str:
    """The kind of chat-message content ``item`` becomes, for :attr:`_Piece.last_seen`."""
    if isinstance(item, Message):
        return item.role
    if isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
        return "output"
    if isinstance(item, (FunctionCall, CustomToolCall)):
        return "call"
    return type(item).__name__


class TemplateRenderError(RenderError):
    """The chat template refused the conversation (``raise_exception`` or a template error)."""


def _refused(exc: Exception, at: int) -> TemplateRenderError:
    """What a template run raised, as a 400: ``raise_exception``, an undefined value, or a Python
    error inside the template (a string plus a mapping, say), as ``apply_chat_template`` would
    raise it to an engine, which answers the same conversation with a 400."""
    import jinja2

    detail = str(exc) if isinstance(exc, jinja2.exceptions.TemplateError) else f"{type(exc).__name__}: {exc}"
    return TemplateRenderError(f"the model's chat template refused the conversation: {detail}", item_index=at, param="type")


@dataclass(frozen=True, slots=True)
class _Header:
    instructions: str | None
    tools: list[dict[str, Any]] | None


@dataclass(slots=True)
class _Piece:
    """What an ``hf`` log node keeps: its item, the template text its segment stands for (the
    first node of a turn holds the turn's text, the others ``""``), and on the last node of a turn
    the tokens of the generation prompt that follows it."""

    item: Item | None
    text: str
    header: _Header | None = None
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
    #: On the last node of a turn: the index of the latest item of each kind (:func:`_kind`) up
    #: to it; a rendering window reaches back to the latest earlier item of each kind the new
    #: items hold.
    last_seen: Mapping[str, int] | None = None
    #: With ``window``: the chat messages the template got for the head, the window's items and
    #: this turn's (never changed once built), so that a turn reusing the window converts only its
    #: own items.
    messages: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class _Certificate:
    """What a turn taken by the window path certified, kept on its last node
    (:attr:`_Piece.window`, :attr:`_Piece.head_text`, :attr:`_Piece.messages`)."""

    window: tuple[int, int]
    head_text: str
    messages: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class _Window:
    """One turn's rendering window over the log ending at ``node`` (whose piece is ``tip``): the
    ``head`` items, then the old items of the ``tail`` nodes (oldest first); ``reused``: the
    previous turn's certificate (:attr:`_Piece.window`) when the window is that turn's."""

    node: Node
    tip: _Piece
    head: tuple[Item, ...]
    header: _Header
    tail: list[Node]
    reused: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class _WindowText:
    """The window's chat ``messages`` with the new items, and the template's text for the window
    alone (``before``), with the new items (``after``) and with the generation prompt (``prompt``)."""

    messages: list[dict[str, Any]]
    before: str
    after: str
    prompt: str


@dataclass(frozen=True, slots=True)
class _LogMatch:
    """A window's text for the old items found in the log: the head's text as the window renders
    it, and the end of the log's text (``old_tail``, at least the window's; ``whole``: all of it)."""

    head_text: str
    old_tail: str
    whole: bool


_encodings: dict[str, tiktoken.Encoding] = {}


def _decoding_table(name: str, files: ModelFiles, vocab: Mapping[str, int], added: Mapping[str, int]) -> tiktoken.Encoding:
    """A ``tiktoken.Encoding`` with the model's id -> bytes table, for decoding sampled ids and the
    byte-length bounds of :func:`~.base.token_floor` (not for prompts: see :meth:`HFRenderer._encode`)."""
    found = _encodings.get(name)
    if found is not None:
        return found
    import json

    model = json.loads(files.tokenizer_json).get("model") or {}
    byte_level = '"ByteLevel"' in files.tokenizer_json
    table = byte_decoder()
    ranks: dict[bytes, int] = {}
    for token, index in sorted(vocab.items(), key=lambda kv: kv[1]):
        if token in added:
            continue
        if byte_level:
            try:
                data = bytes(table[c] for c in token)
            except KeyError:
                data = token.encode()
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token) and model.get("byte_fallback"):
            data = bytes([int(token[3:5], 16)])
        else:
            data = token.replace("▁", " ").encode()
        ranks.setdefault(data, index)  # a duplicate byte string keeps its first id
    specials = dict(added)
    top = max([*ranks.values(), *specials.values(), files.vocab_size - 1])
    for b in range(256):  # tiktoken needs every single byte
        if bytes([b]) not in ranks:
            top += 1
            ranks[bytes([b])] = top
    # An engine may sample any id of the model's (padded) vocabulary: ids without a token decode
    # to a placeholder instead of failing.
    used = set(ranks.values()) | set(specials.values())
    for index in range(top + 1):
        if index not in used:
            specials[f"<|unused_id_{index}|>"] = index
    enc = tiktoken.Encoding(
        name,
        pat_str=r"""[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
        mergeable_ranks=ranks,
        special_tokens=specials,
    )
    _encodings[name] = enc
    return enc


def _fast_encoding(files: ModelFiles, tok: Tokenizer, fast_encode: bool | None) -> tuple[FastEncoder | None, str | None]:
    """The verified tiktoken encoder for template text (:mod:`.hf_tiktoken`), or None and why not
    (``"disabled"``, or its refusal). ``fast_encode=None`` takes it unless the environment sets
    ``RESPONSES_CACHE_HF_FAST=0``."""
    if fast_encode is None:
        fast_encode = os.environ.get("RESPONSES_CACHE_HF_FAST", "1").strip().lower() not in ("0", "false", "no", "off")
    if not fast_encode:
        return None, "disabled"
    built = fast_encoder(files.tokenizer_json, tok)
    if isinstance(built, Refused):
        return None, str(built)
    return built, None


def _end_ids(files: ModelFiles, added: Mapping[str, int]) -> tuple[int | None, tuple[int, ...]]:
    """The model's EOS id (the template's ``eos_token``, else the family's first end-of-turn
    token), and every stop id: EOS, ``generation_config.json``'s ``eos_token_id`` and the family's
    end-of-turn tokens, without duplicates."""
    stops = [added[t] for t in _END_TOKENS if t in added]
    eos_token = files.template_tokens.get("eos_token")
    eos = added.get(eos_token) if eos_token else None
    if eos is None and stops:
        eos = stops[0]
    ids = [i for i in (eos, *files.generation_eos, *stops) if i is not None]
    return eos, tuple(dict.fromkeys(ids))


class HFRenderer:
    """Renders Responses conversations with a Hugging Face model's chat template and tokenizer.

    ``model``: a model directory, a Hugging Face cache entry or a cached model id (see
    :func:`~.hf_files.load_model_files`). ``history``: the rewrite policy (module docstring).
    ``window``: how many recent items (at least) the template runs over each turn, see the module
    docstring; ``None`` runs it over the whole conversation every turn.
    ``template_kwargs``: extra template variables (``enable_thinking=False``,
    ``date_string="26 Jul 2024"``…), part of the renderer's key. ``chat_template``: a template to
    use instead of the model's (a ``.jinja`` path or the text). ``parser``: the output format
    (``hermes``, ``llama3``, ``deepseek``, ``mistral``, ``plain``), detected from the template when
    left out. ``fast_encode``: encode template text with a tiktoken encoder built from the model's
    ``tokenizer.json`` where it provably gives ``tokenizers``' ids (:mod:`.hf_tiktoken`; refused
    shapes and unverifiable text use ``tokenizers``); ``None`` (default) takes it unless the
    environment sets ``RESPONSES_CACHE_HF_FAST=0``. :attr:`fast_refusal` says why it is off.
    """

    template = "hf"

    def __init__(
        self,
        model: str,
        *,
        history: History = "template",
        template_kwargs: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
        parser: str | None = None,
        window: int | None = 8,
        fast_encode: bool | None = None,
    ) -> None:
        if window is not None and window < 1:
            raise ValueError(f"window must be a positive number of items or None, not {window}")
        if history not in ("template", "keep"):
            raise ValueError(f"history must be 'template' or 'keep', not {history!r}")
        files = load_model_files(model, chat_template=chat_template)
        self.files = files
        self.history: History = history
        self.window = window
        self.template_kwargs = dict(template_kwargs or {})
        self._template = compile_template(files.chat_template)
        self._tok = files.tokenizer()
        self._plain = files.tokenizer()
        self._plain.encode_special_tokens = True  # user text: special-token look-alikes stay text
        vocab = self._tok.get_vocab(with_added_tokens=True)
        decoder = self._tok.get_added_tokens_decoder()
        self._added = {t.content: i for i, t in decoder.items()}
        added_pattern = literals_pattern(self._added)
        self._added_re = re.compile(added_pattern)
        self._added_end_re = re.compile(f"(?:{added_pattern})$")
        self._fast: FastEncoder | None
        #: Why template text is encoded with ``tokenizers`` alone (None: the fast path is on).
        self.fast_refusal: str | None
        self._fast, self.fast_refusal = _fast_encoding(files, self._tok, fast_encode)
        #: (the added token the text ends with, generation prompt) -> the prompt's ids: nothing
        #: before an added token merges with what follows it.
        self._gen_cache: dict[tuple[str, str], list[int]] = {}
        #: Short texts from an added token to the end of a turn (``<|im_end|>\n``…) -> their ids.
        self._tail_cache: dict[str, list[int]] = {}
        self._parsed: OrderedDict[str, dict[str, Any]] = OrderedDict()
        options = repr((history, sorted(self.template_kwargs.items()), files.digest))
        self._key = hashlib.blake2b(f"hf\x00{options}".encode(), digest_size=16).digest()
        label = files.path.name or "model"
        self._name = f"hf/{label}-{files.digest[:8]}"
        self._encoding = _decoding_table(f"hf-{files.digest}-{files.vocab_size}", files, vocab, self._added)
        self._stats = RenderStats()
        self.format = parser or detect_format(files.chat_template)
        self._eos, self._stops = _end_ids(files, self._added)
        self._template_tokens = dict(files.template_tokens)
        self._gen_prompt = self._typical_generation_prompt()
        #: Whether the template writes a request's tool definitions, and an assistant message's
        #: tool calls (probed at load: a template without them leaves the model blind to tools
        #: or to its own earlier calls, as the engine's chat endpoint would; logged as a warning).
        self.renders_tools, self.renders_calls = self._tool_support()
        self._warn_without_tools()

    def _warn_without_tools(self) -> None:
        """Log a warning for what the template does not write (:meth:`_tool_support`)."""
        for renders, what in ((self.renders_tools, "tool definitions"), (self.renders_calls, "assistant tool calls")):
            if not renders:
                logger.warning(
                    "the chat template of %s does not write %s: the model will not see them (nor would it "
                    "through the engine's chat endpoint); to serve tool-using clients, give the renderer and "
                    "the engine a tool-capable template (chat_template.jinja in the model directory, or "
                    "chat_template=...)", self._name, what,
                )

    # -- identity -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """``"hf/<model dir>-<digest>"``."""
        return self._name

    @property
    def key(self) -> bytes:
        """A digest of tokenizer, template, template variables and policy."""
        return self._key

    @property
    def stats(self) -> RenderStats:
        return self._stats

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The model's id -> bytes table as a ``tiktoken.Encoding`` (for decoding; prompts are
        tokenized by :meth:`_encode`)."""
        return self._encoding

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        """EOS, ``generation_config.json``'s ``eos_token_id`` and the family's end-of-turn tokens."""
        return self._stops

    @property
    def sampling_stop_tokens(self) -> tuple[int, ...]:
        return self._stops

    @property
    def generation_prompt(self) -> array[int]:
        """The generation prompt after a user message (a copy); after other messages the template
        may give another one, which :meth:`prompt` uses."""
        return array("I", self._gen_prompt)

    def end_token(self, tool_call: bool) -> int:
        assert self._stops, "the vocabulary has no end-of-turn token"
        return self._eos if self._eos is not None else self._stops[0]

    def output_parser(self, custom_tools: frozenset[str] = frozenset()) -> OutputParser:
        return family_parser(
            self.format,
            custom_tools,
            in_think=opens_think(self.decode(list(self._gen_prompt))),
            specials=frozenset(self._added),
        )

    def tool_call_prefix(self, name: str | None) -> str:
        return tool_call_prefix(self.format, name, in_think=opens_think(self.decode(list(self._gen_prompt))))

    def fingerprint(self, instructions: str | None, tools: ToolSet) -> bytes:
        h = hashlib.blake2b(self._key, digest_size=16)
        if instructions:
            h.update(b"\x01")
            h.update(instructions.encode("utf-8", "surrogatepass"))
        else:
            h.update(b"\x00")
        h.update(tools.fingerprint)
        return h.digest()

    # -- text ---------------------------------------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        """Plain-text tokens (special-token look-alikes stay plain text)."""
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def encode_with_specials(self, text: str) -> list[int]:
        """Tokens of ``text`` with its special tokens recognised (as the engine's ``/tokenize``)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._encoding.decode(list(ids))

    def count_text(self, text: str) -> int:
        return len(self._plain.encode(text, add_special_tokens=False).ids)

    def hidden_before(self, facts: object) -> int:
        return 0

    # -- rendering ----------------------------------------------------------------------------

    def render_text(
        self,
        instructions: str | None,
        tools: ToolSet,
        items: Sequence[Item],
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for the whole conversation: with the generation prompt, what
        :meth:`prompt` tokenizes (``apply_chat_template``'s text); without, what the token log
        holds (a template that ends every conversation with constant text, as Llama 3's original
        one, counts that text as the generation prompt)."""
        return self._render(chat_messages(instructions, items), chat_tools(tools), add_generation_prompt)

    def chat_messages(self, instructions: str | None, items: Sequence[Item]) -> list[dict[str, Any]]:
        """The conversation as the chat messages this renderer hands the template (arguments as
        objects; :func:`~.hf_messages.engine_messages` gives the wire form an engine's
        ``/tokenize`` or chat endpoint takes)."""
        return chat_messages(instructions, items)

    @staticmethod
    def chat_tools(tools: ToolSet) -> list[dict[str, Any]] | None:
        """The request's tools as the template (and an engine's chat endpoint) sees them."""
        return chat_tools(tools)

    def _messages(
        self, instructions: str | None, items: Sequence[Item], *, first_new: int = 0, calls: Callable[[str], str | None] | None = None
    ) -> list[dict[str, Any]]:
        self._stats.items_converted += len(items)
        return chat_messages(instructions, items, first_new=first_new, calls=calls, arguments=self._arguments)

    def _arguments(self, text: str) -> dict[str, Any]:
        """A function call's arguments as the template sees them, parsed once per text and frozen
        for the template's ``tojson`` (:class:`~.hf_files.FrozenJSON`): nothing changes them."""
        found = self._parsed.get(text)
        if found is None:
            found = self._parsed[text] = parse_arguments(text)
            if len(self._parsed) > _PARSED:
                self._parsed.popitem(last=False)
        self._template.json.freeze(found)
        return found

    def _variables(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        if tools:  # the header's tool definitions: built once, never changed
            self._template.json.freeze(tools, deep=True)
        return {**self._template_tokens, **self.template_kwargs, "messages": template_view(messages), "tools": tools, "documents": None}

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool, at: int = 0) -> str:
        """The template's whole text (``gen``), or the text the token log holds (without the
        generation prompt or a constant tail, :meth:`~.hf_files.ChatTemplate.text`)."""
        self._stats.template_runs += 1
        try:
            variables = self._variables(messages, tools)
            return self._template.render(True, variables) if gen else self._template.text(variables)
        except Exception as exc:
            raise _refused(exc, at) from None

    def _render_pair(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> tuple[str, str]:
        """The template's text without and with the generation prompt (one run of the template
        when its structure allows, see :class:`~.hf_files.ChatTemplate`)."""
        self._stats.template_runs += 1 if self._template.one_run else 2
        try:
            return self._template.render_pair(self._variables(messages, tools))
        except Exception as exc:
            raise _refused(exc, 0) from None

    def _encode(self, text: str) -> list[int]:
        """Template text's ids (added tokens recognised): the verified tiktoken encoder when it
        vouches for them, else ``tokenizers``."""
        if self._fast is not None:
            fast = self._fast.encode(text)
            if fast is not None:
                self._stats.fast_encodes += 1
                self._stats.tokens_encoded += len(fast)
                return fast
        # ``encode_batch_fast``: the same ids as ``encode``, without computing character offsets.
        ids: list[int] = self._tok.encode_batch_fast([text], add_special_tokens=False)[0].ids
        self._stats.slow_encodes += 1
        self._stats.tokens_encoded += len(ids)
        return ids

    def _tokens_after(self, old: str, new: str, *, whole: bool = True) -> list[int] | None:
        """The tokens ``new`` adds when the text ``old`` (already tokenized) is followed by it, or
        None when tokens would merge across the boundary. ``whole``: ``old`` is the complete text
        (its start is a boundary); otherwise it is a tail and must hold an added token."""
        if not new:
            return []
        start = None
        for window in (*_WINDOWS, None):
            tail = old if window is None else old[-window:]
            last = None
            for last in self._added_re.finditer(tail):  # noqa: B007 - the last match is wanted
                pass
            if last is not None:
                start = len(old) - len(tail) + last.start()
                break
            if window is not None and window >= len(old):
                start = 0
                break
        if start is None or (start == 0 and not whole and not self._added_re.match(old)):
            if not whole:
                return None
            start = 0
        tail = old[start:]
        before = self._tail_cache.get(tail) if len(tail) <= 64 else None
        if before is None:
            before = self._encode(tail) if tail else []
            if len(tail) <= 64 and len(self._tail_cache) < 256:
                self._tail_cache[tail] = before
        both = self._encode(tail + new)
        if both[: len(before)] != before:
            return None
        return both[len(before) :]

    def _generation(
        self, text: str, prompt_text: str, *, whole: bool = True
    ) -> tuple[str | None, array[int] | None, array[int] | None]:
        """(generation prompt text, its tokens, or -- ``whole`` texts only -- the whole prompt's
        tokens when the prompt does not extend the conversation's text)."""
        if prompt_text.startswith(text):
            gen_text = prompt_text[len(text) :]
            # The same generation prompt after the same last token comes back every turn.
            last = self._added_end_re.search(text[-64:])
            key = (last.group(), gen_text) if last is not None else None
            ids = self._gen_cache.get(key) if key is not None else None
            if ids is None:
                ids = self._tokens_after(text, gen_text, whole=whole)
                if ids is not None and key is not None and len(self._gen_cache) < 64:
                    self._gen_cache[key] = ids
            if ids is not None:
                return gen_text, array("I", ids), None
        if not whole:
            return None, None, None
        return None, None, array("I", self._encode(prompt_text))

    def _typical_generation_prompt(self) -> array[int]:
        messages = [{"role": "user", "content": "x"}]
        try:
            text, full = self._render_pair(messages, None)
        except RenderError:
            return array("I")
        _, gen, _ = self._generation(text, full)
        return gen if gen is not None else array("I")

    def _tool_support(self) -> tuple[bool, bool]:
        """(tool definitions written, tool calls written): whether the template's text changes
        when a probe tool is declared, and when an assistant message carries a probe call. A
        template that refuses a probe is taken to write it (it reads it)."""
        # As requests make them (nine letters and digits for the call id: Mistral's templates take no other).
        tools = chat_tools(parse_tools(b'[{"type": "function", "name": "probe_tool", "description": "A probe."}]'))
        user = Message(role="user", content="x")
        answer = chat_messages(None, [user, Message(role="assistant", content="")])
        called = chat_messages(None, [user, FunctionCall(call_id="probecall", name="probe_tool", arguments="{}")])
        Rendering = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]  # (messages, tools)

        def changes(plain: Rendering, probed: Rendering) -> bool:
            try:
                return self._render(*plain, False) != self._render(*probed, False)
            except RenderError:
                return True

        first = answer[:1]
        return changes((first, None), (first, tools)), changes((answer, tools), (called, tools))

    def begin(self, instructions: str | None, tools: ToolSet) -> TokenLog:
        """A log holding the header: the template's text for the instructions and tools alone
        (empty when the template cannot render them without messages)."""
        header = _Header(instructions or None, chat_tools(tools))
        messages = self._messages(header.instructions, [])
        piece = _Piece(None, "", header)
        seg = array("I")
        try:
            text, prompt_text = self._render_pair(messages, header.tools)
        except RenderError:
            pass
        else:
            seg = array("I", self._encode(text))
            piece.text = text
            piece.gen_text, piece.gen, piece.whole_prompt = self._generation(text, prompt_text)
        ctx = LogContext(self.name, self._key, self.fingerprint(instructions, tools))
        return TokenLog(Node(None, ctx, seg, 0, NO_FACTS, 0, data=piece))

    def render_full(self, instructions: str | None, tools: ToolSet, items: Sequence[Item]) -> TokenLog:
        return self.extend(self.begin(instructions, tools), items)

    def prompt(self, log: TokenLog) -> array[int]:
        """The log's tokens and the generation prompt the template gives after its last message."""
        piece = self._piece(log._node)
        if piece.whole_prompt is not None:
            return array("I", piece.whole_prompt)
        if piece.gen is None:  # a header the template could not render alone
            chain = self._chain(log._node)
            header = self._piece(chain[0]).header
            assert header is not None
            messages = self._messages(header.instructions, [self._piece(n).item for n in chain[1:]])  # type: ignore[misc]
            return array("I", self._encode(self._render(messages, header.tools, True)))
        out = log.tokens()
        out.extend(piece.gen)
        return out

    def rewind(self, log: TokenLog, item_index: int) -> TokenLog:
        """The log of the first ``item_index`` items, when a turn boundary falls there; a cut inside
        a turn's segment raises ``ValueError`` (the caller renders in full)."""
        node = log._node
        if node.ctx.key != self._key:
            raise ValueError(f"this log was rendered by {node.ctx.name} with other options")
        if not 0 <= item_index <= log.num_items:
            raise IndexError(f"cannot rewind a log of {log.num_items} items to {item_index}")
        if item_index == log.num_items:
            return log
        if ancestor(node, item_index).flags & JOINED:
            raise ValueError("the hf renderer cuts a log only between turns")
        return TokenLog(ancestor(node, item_index - 1))

    def extend(self, log: TokenLog, items: Sequence[Item], *, sampled: Sequence[int] | None = None) -> TokenLog:
        """``log`` plus the template's text for ``items``, tokenized from the last added token of
        the old text on (see the module docstring for the checks and the history policy).
        ``sampled``: the ids the model produced after :meth:`prompt` for these output items; kept
        only with ``history="keep"``."""
        node = log._node
        if node.ctx.key != self._key:
            raise ValueError(f"this log was rendered by {node.ctx.name} with other options; {self.name} cannot extend it")
        if not items:
            return log
        if sampled is not None:
            for i, item in enumerate(items):
                if not is_assistant_output(item):
                    raise ValueError(f"sampled ids given, but items[{i}] ({type(item).__name__}) is not assistant output")
        self._stats.items_rendered += len(items)
        if self.window is not None:
            windowed = self._extend_windowed(node, items, sampled)
            if windowed is not None:
                return windowed
        chain = self._chain(node)
        pieces = [self._piece(n) for n in chain]
        header = pieces[0].header
        assert header is not None
        old_items: list[Item] = [p.item for p in pieces[1:]]  # type: ignore[misc]
        old_text = "".join(p.text for p in pieces)
        all_items = [*old_items, *items]
        messages = self._messages(header.instructions, all_items, first_new=len(old_items))
        text, prompt_text = self._render_pair(messages, header.tools)
        self._stats.full_renders += 1
        if text.startswith(old_text):
            added = text[len(old_text) :]
            ids = self._tokens_after(old_text, added)
            if ids is not None:
                seg = self._keep_sampled(pieces[-1], added, sampled)
                gen = self._generation(text, prompt_text)
                return self._append(node, items, added, array("I", ids) if seg is None else seg, gen)
            merged = self._merge_last_turn(chain, pieces, items, text, prompt_text)
            if merged is not None:
                return merged
        self._stats.rewinds += 1
        kept = self._keep_turns(chain, pieces, text)
        if kept is not None:
            start, ids = kept
            gen = self._generation(text, prompt_text)
            before = sum(len(p.text) for p in pieces[:start])
            return self._append(chain[start - 1], all_items[start - 1 :], text[before:], array("I", ids), gen)
        return self._rebuild(chain[0], all_items, text, prompt_text)

    def _keep_turns(self, chain: list[Node], pieces: list[_Piece], text: str) -> tuple[int, list[int]] | None:
        """After a rewrite: the last turn start (an index into ``chain``) whose earlier text the
        new text still begins with, and the tokens of the new text from there; None if none."""
        old = "".join(p.text for p in pieces)
        low = common_prefix_length(old, text)
        offset = sum(len(p.text) for p in pieces)
        for k in range(len(chain) - 1, 0, -1):
            offset -= len(pieces[k].text)
            if chain[k].flags & JOINED or offset > low:
                continue
            ids = self._retokenize(chain[k:], old[:offset], text[offset:])
            if ids is not None:
                return k, ids
        return None

    def _retokenize(self, nodes: Sequence[Node], old: str, new: str, *, whole: bool = True) -> list[int] | None:
        """The ids of ``new``, the template's text from the start of the turn ``nodes`` begins
        with (the log's nodes from there on) after the log's text ``old`` (``whole``: all of it);
        None when tokens would merge across that boundary. With ``history="keep"`` the turns from
        there on whose ids still spell the start of ``new`` keep them, and only the text after
        them is tokenized: what the template rewrote was around the ids the model sampled, not in
        them (Qwen3's empty thinking block, written in the last answer and dropped once a message
        follows it, was never sampled)."""
        if self.history == "keep":
            kept: list[int] = []
            turns = at = 0
            for node in nodes:
                if node.flags & JOINED:
                    continue
                spelled = self.decode(node.seg)
                if not spelled or not new.startswith(spelled, at):
                    break
                kept.extend(node.seg)
                at += len(spelled)
                turns += 1
            if turns:
                rest = self._tokens_after(old + new[:at], new[at:], whole=whole)
                if rest is not None:
                    self._stats.sampled_kept += turns
                    return kept + rest
        return self._tokens_after(old, new, whole=whole)

    def _keep_sampled(self, tip: _Piece, added: str, sampled: Sequence[int] | None) -> array[int] | None:
        if sampled is None or self.history != "keep":
            return None
        seg = self._sampled_segment(tip, added, sampled)
        if seg is None:
            self._stats.sampled_rejected += 1
        else:
            self._stats.items_sampled += 1
        return seg

    def _extend_windowed(self, node: Node, items: Sequence[Item], sampled: Sequence[int] | None) -> TokenLog | None:
        """The fast path: run the template over the head (the items up to the first user message)
        and the last ``window``-or-more items, starting at a user message. The window is
        *certified* -- its text for the old items must equal the end of the log's text, and adding
        the new items must only append -- else None (the whole conversation is rendered).

        The previous turn's window is reused while it satisfies this turn's rule (it starts no later
        than this turn's window would, at a window start) and holds at most twice as many old items
        as this turn's window would: its text for the old items is then known (the certificate of
        the previous turn, ``_Piece.window``), and the template runs once, over the window and the
        new items, instead of also over the window alone."""
        window = self._window(node, items)
        if window is None:
            return None
        messages, new_messages = self._window_messages(window, items)
        try:
            before, known = self._window_before(window, messages)
            after, prompt_text = self._render_pair(new_messages, window.header.tools)
        except RenderError:
            return None  # e.g. a template checking alternation by position: render all
        self._stats.window_renders += 1
        text = _WindowText(new_messages, before, after, prompt_text)
        match = self._match_log(window, text, known)
        if match is None:
            return None
        if not text.after.startswith(text.before):
            return self._rewrite_window(window, items, text, match)
        return self._append_window(window, items, sampled, text, match)

    def _window(self, node: Node, items: Sequence[Item]) -> _Window | None:
        """This turn's window over the log ending at ``node``: the head and the last
        ``window``-or-more old items from a window start (:meth:`_starts_window`), reaching back
        as :meth:`_reach` says, or the previous turn's window when it can be reused
        (:meth:`_reusable`). None when the whole conversation is rendered: before the first user
        message, when a system or developer message joins, while the conversation is short."""
        assert self.window is not None
        tip = self._piece(node)
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
        return _Window(node, tip, head, header, tail, tip.window if extra is not None else None)

    @staticmethod
    def _reach(node: Node, tip: _Piece, head: tuple[Item, ...], items: Sequence[Item]) -> int:
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
        kinds = {_kind(i) for i in items} | {"system", "developer"}
        return min((seen[k] for k in kinds if seen.get(k, -1) >= len(head)), default=node.index)

    def _starts_window(self, node: Node, to_user: bool) -> bool:
        """Whether a window may start at ``node``: a message-group start (:func:`_starts_group`),
        and a user message when the new items hold a message (``to_user``)."""
        item = self._piece(node).item
        return (
            node.parent is not None
            and _starts_group(item, node.parent.data)
            and (not to_user or (isinstance(item, Message) and item.role == "user"))
        )

    def _reusable(self, node: Node, tip: _Piece, tail: list[Node], to_user: bool) -> list[Node] | None:
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

    def _window_messages(self, window: _Window, items: Sequence[Item]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The chat messages of the window alone (kept from the turn before when it is reused), and
        with the new items."""
        node, header = window.node, window.header

        def lookup(call_id: str) -> str | None:
            return find_call(node, call_id)

        tail_items: list[Item] = [self._piece(n).item for n in window.tail]  # type: ignore[misc]
        old_items = [*window.head, *tail_items]
        messages = window.tip.messages if window.reused is not None else None
        if messages is None:
            messages = self._messages(header.instructions, old_items, calls=lookup)
        if _starts_group(items[0], window.tip):  # the window's last message is complete: add the new ones
            return messages, [*messages, *self._messages(None, items, calls=lookup)]
        return messages, self._messages(header.instructions, [*old_items, *items], first_new=len(old_items), calls=lookup)

    def _window_before(self, window: _Window, messages: list[dict[str, Any]]) -> tuple[str, tuple[str, bool] | None]:
        """The template's text for the window alone: known from the previous turn's certificate
        when the window is reused (then also the end of the log's text it was read from, and
        whether that is all of it), else rendered from ``messages``."""
        if window.reused is None:
            return self._render(messages, window.header.tools, False), None
        length = window.reused[1]
        old_tail, whole = self._tail_text(window.node, length + _WINDOWS[0])
        assert window.tip.head_text is not None, "a window is certified with the head's text"
        before = window.tip.head_text + old_tail[len(old_tail) - length :]
        assert len(old_tail) >= length, "a window's text is part of the log's"
        return before, (old_tail, whole)

    def _match_log(self, window: _Window, text: _WindowText, known: tuple[str, bool] | None) -> _LogMatch | None:
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
            known = self._tail_text(window.node, len(recent) + _WINDOWS[0])
            if not known[0].endswith(recent):
                self._stats.window_misses += 1
                return None
        return _LogMatch(head_text, *known)

    def _append_window(
        self, window: _Window, items: Sequence[Item], sampled: Sequence[int] | None, text: _WindowText, match: _LogMatch
    ) -> TokenLog | None:
        """The log plus the new items' text, tokenized after the end of the log's text, with this
        turn's certificate. None when the tokens would merge across that boundary or the
        generation prompt does not follow it."""
        added = text.after[len(text.before) :]
        old_tail, whole = match.old_tail, match.whole
        ids = self._tokens_after(old_tail, added, whole=whole)
        if ids is None:
            return None
        seg = self._keep_sampled(window.tip, added, sampled)
        gen = (
            self._generation(old_tail + added, old_tail + text.prompt[len(text.before) :], whole=whole)
            if text.prompt.startswith(text.before)
            else None
        )
        if gen is None or gen[1] is None:
            return None
        recent = len(text.before) - len(match.head_text)
        certificate = _Certificate((window.tail[0].index, recent + len(added)), match.head_text, text.messages)
        return self._append(window.node, items, added, array("I", ids) if seg is None else seg, gen, certificate)

    def _rewrite_window(self, window: _Window, items: Sequence[Item], text: _WindowText, match: _LogMatch) -> TokenLog | None:
        """The new items make the template rewrite the window's text for old items (Qwen3 writes
        an empty thinking block in its last answer and drops it once a message follows, and drops
        the reasoning after the last user message once a new one comes). As a rendering of the
        whole conversation would (:meth:`_keep_turns`), the log keeps every turn before the
        rewritten one and the text from that turn's start on is tokenized again (with
        ``history="keep"``, :meth:`_retokenize` keeps the ids of turns that still spell it) --
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
            suffix += len(self._piece(node).text)
            newest_first.append(node)
            at = len(before) - suffix  # where the node's turn starts in the window's text
            if node.flags & JOINED or at > common:
                continue
            old = match.old_tail[: len(match.old_tail) - suffix]  # the log's text before the turn
            nodes = newest_first[::-1]
            ids = self._retokenize(nodes, old, after[at:], whole=match.whole)
            if ids is None:
                continue
            gen = self._generation(old + after[at:], old + text.prompt[at:], whole=match.whole)
            if gen[1] is None:
                return None
            assert node.parent is not None, "a window holds no header"
            self._stats.rewinds += 1
            window_text = len(after) - len(match.head_text)
            certificate = _Certificate((window.tail[0].index, window_text), match.head_text, text.messages)
            turn: list[Item] = [self._piece(n).item for n in nodes]  # type: ignore[misc]
            return self._append(node.parent, [*turn, *items], after[at:], array("I", ids), gen, certificate)
        return None

    def _head_in_context(self, node: Node, tail: list[Node], before: str) -> str | None:
        """The head's text as the window renders it, when that is not its text alone (Mistral's
        templates write the system prompt into the last user message only): ``before`` less the
        log's text for the window's items, certified as the start of the log's text (the window
        then renders as the log's start followed by the log's end, as with the head's text
        alone). None when the window does not start a turn or that does not hold."""
        if tail[0].flags & JOINED:
            return None
        recent = "".join(self._piece(n).text for n in tail)
        if not before.endswith(recent):
            return None
        head_text = before[: len(before) - len(recent)]
        return head_text if self._text(node, len(head_text)).startswith(head_text) else None

    def _text(self, node: Node, chars: int | None = None) -> str:
        """The start of the log's text, at least ``chars`` long (all of it by default)."""
        parts: list[str] = []
        total = 0
        for n in self._chain(node):
            if chars is not None and total >= chars:
                break
            parts.append(self._piece(n).text)
            total += len(parts[-1])
        return "".join(parts)

    def _tail_text(self, node: Node, chars: int) -> tuple[str, bool]:
        """The end of the log's text, at least ``chars`` long (or all of it: then True)."""
        parts: list[str] = []
        total = 0
        cur: Node | None = node
        while cur is not None and total < chars:
            text = self._piece(cur).text
            parts.append(text)
            total += len(text)
            cur = cur.parent
        parts.reverse()
        return "".join(parts), cur is None

    # -- machinery ----------------------------------------------------------------------------

    @staticmethod
    def _piece(node: Node) -> _Piece:
        piece = node.data
        if not isinstance(piece, _Piece):
            raise ValueError("this log was not rendered by an hf renderer")
        return piece

    @staticmethod
    def _chain(node: Node) -> list[Node]:
        chain: list[Node] = []
        cur: Node | None = node
        while cur is not None:
            chain.append(cur)
            cur = cur.parent
        chain.reverse()
        return chain

    def _append(
        self,
        node: Node,
        items: Sequence[Item],
        text: str,
        seg: array[int],
        gen: tuple[str | None, array[int] | None, array[int] | None],
        certificate: _Certificate | None = None,
    ) -> TokenLog:
        """``node`` plus one turn: the first item's node holds ``seg`` and ``text``, the others are
        ``JOINED``; the last one holds the generation prompt ``gen`` (and the window path's
        ``certificate``: its window, the head's text in the window when it is not the parent's,
        and the window's messages)."""
        ctx = node.ctx
        parent = self._piece(node)
        header = parent.header
        head, head_text = parent.head, parent.head_text if certificate is None else certificate.head_text
        if head is None and any(isinstance(i, Message) and i.role == "user" for i in items):
            head, head_text = self._head(node, items, header)
            if not (self._text(node) + text).startswith(head_text):
                head_text = None  # rendered otherwise when followed: a window certifies it
        last = len(items) - 1
        seen = {**(parent.last_seen or {}), **{_kind(item): node.index + 1 + k for k, item in enumerate(items)}}
        for k, item in enumerate(items):
            call_id = target = None
            if isinstance(item, (FunctionCall, CustomToolCall)):
                call_id, target = item.call_id, qualified(item.namespace, item.name)
            piece = _Piece(item, text if k == 0 else "", header, head, head_text)
            if k == last:
                piece.gen_text, piece.gen, piece.whole_prompt = gen
                piece.last_seen = seen
                if certificate is not None:
                    piece.window, piece.messages = certificate.window, certificate.messages
            node = Node(node, ctx, seg if k == 0 else array("I"), JOINED if k else 0, NO_FACTS, 0, call_id, target, piece)
        return TokenLog(node)

    def _head(self, node: Node, items: Sequence[Item], header: _Header | None) -> tuple[tuple[Item, ...] | None, str]:
        """The items up to and including the first user message, and the template's text for them."""
        assert header is not None
        found: list[Item] = [self._piece(n).item for n in self._chain(node)[1:]]  # type: ignore[misc]
        for item in items:
            found.append(item)
            if isinstance(item, Message) and item.role == "user":
                break
        try:
            text = self._render(self._messages(header.instructions, found), header.tools, False)
        except RenderError:
            return None, ""
        return tuple(found), text

    def _merge_last_turn(
        self, chain: list[Node], pieces: list[_Piece], items: Sequence[Item], text: str, prompt_text: str
    ) -> TokenLog | None:
        """The new text merges with the end of the last turn's (a template without an added token
        between messages): tokenize the last turn and the new items together, from the start of
        the last turn's segment. None when that does not hold either."""
        start = len(chain) - 1
        while start > 0 and chain[start].flags & JOINED:
            start -= 1
        if start == 0:
            return None
        before = "".join(p.text for p in pieces[:start])
        ids = self._tokens_after(before, text[len(before) :])
        if ids is None:
            return None
        self._stats.turns_merged += 1
        turn = [p.item for p in pieces[start:]]
        gen = self._generation(text, prompt_text)
        return self._append(chain[start - 1], [*turn, *items], text[len(before) :], array("I", ids), gen)  # type: ignore[list-item]

    def _rebuild(self, root: Node, items: Sequence[Item], text: str, prompt_text: str) -> TokenLog:
        """A log of ``text`` tokenized afresh, reusing the header when it is still a prefix."""
        head = self._piece(root)
        if not text.startswith(head.text):
            assert head.header is not None
            root = Node(None, root.ctx, array("I"), 0, NO_FACTS, 0, data=_Piece(None, "", head.header))
            head = self._piece(root)
        ids = self._tokens_after(head.text, text[len(head.text) :]) if head.text else self._encode(text)
        if ids is None:
            assert head.header is not None
            root = Node(None, root.ctx, array("I"), 0, NO_FACTS, 0, data=_Piece(None, "", head.header))
            ids = self._encode(text)
            head = self._piece(root)
        return self._append(root, items, text[len(head.text) :], array("I", ids), self._generation(text, prompt_text))

    def _sampled_segment(self, tip: _Piece, added: str, sampled: Sequence[int]) -> array[int] | None:
        """``history="keep"``: the generation prompt, the sampled ids up to the end token, then the
        tokens of the text the template puts after that token. None when the template's text for
        the turn does not start with the generation prompt or has no end token."""
        if tip.gen is None or tip.gen_text is None or not added.startswith(tip.gen_text):
            return None
        body = added[len(tip.gen_text) :]
        ends = {self.decode([t]): t for t in self._stops}
        best = max(((body.rfind(s), s) for s in ends), default=(-1, ""))
        if best[0] < 0:
            return None
        at, stop_text = best
        ids = list(sampled)
        while ids and ids[-1] in self._stops and ids[-1] != ends[stop_text]:
            ids.pop()
        if not ids or ids[-1] != ends[stop_text]:
            ids.append(ends[stop_text])
        trailing = self._tokens_after(stop_text, body[at + len(stop_text) :])
        if trailing is None:
            return None
        seg = array("I", tip.gen)
        seg.extend(ids)
        seg.extend(trailing)
        return seg
