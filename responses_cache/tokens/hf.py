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

The parts. :class:`HFRenderer` holds the model's files and identity, answers the renderer
protocol, and renders a turn over the whole conversation when the window path declines;
:mod:`.hf_runner` runs the template over chat messages, :mod:`.hf_encoding` gives the ids template
text adds after text already tokenized, :mod:`.hf_history` applies the ``history`` option,
:mod:`.hf_log` is what each log node keeps and how a turn is appended, and :mod:`.hf_window` is the
window path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from array import array
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import tiktoken

from ..protocol.items import FunctionCall, Item, Message
from ..protocol.tools import ToolSet, parse_tools
from . import hf_log
from .base import RenderStats, common_prefix_length, is_assistant_output
from .errors import RenderError
from .hf_encoding import TemplateEncoder
from .hf_files import ModelFiles, compile_template, load_model_files
from .hf_history import History, HistoryPolicy
from .hf_log import Header, LogWriter, Piece
from .hf_messages import chat_messages, chat_tools
from .hf_parsing import detect_format, family_parser, tool_call_prefix
from .hf_runner import TemplateRenderError, TemplateRunner
from .hf_tiktoken import FastEncoder, Refused, byte_decoder, fast_encoder
from .hf_window import WindowPath
from .log import JOINED, NO_FACTS, LogContext, Node, TokenLog, ancestor
from .parsing import OutputParser, opens_think

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["HFRenderer", "History", "TemplateRenderError"]

logger = logging.getLogger("responses_cache.tokens")

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
        self.template_kwargs = dict(template_kwargs or {})
        tok = files.tokenizer()
        self._plain = files.tokenizer()
        self._plain.encode_special_tokens = True  # user text: special-token look-alikes stay text
        vocab = tok.get_vocab(with_added_tokens=True)
        self._added = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
        fast: FastEncoder | None
        #: Why template text is encoded with ``tokenizers`` alone (None: the fast path is on).
        self.fast_refusal: str | None
        fast, self.fast_refusal = _fast_encoding(files, tok, fast_encode)
        options = repr((history, sorted(self.template_kwargs.items()), files.digest))
        self._key = hashlib.blake2b(f"hf\x00{options}".encode(), digest_size=16).digest()
        label = files.path.name or "model"
        self._name = f"hf/{label}-{files.digest[:8]}"
        self._encoding = _decoding_table(f"hf-{files.digest}-{files.vocab_size}", files, vocab, self._added)
        self._stats = RenderStats()
        self.format = parser or detect_format(files.chat_template)
        self._eos, self._stops = _end_ids(files, self._added)
        self._runner = TemplateRunner(compile_template(files.chat_template), files.template_tokens, self.template_kwargs, self._stats)
        self._encoder = TemplateEncoder(tok, self._added, fast, self._stats)
        self._history = HistoryPolicy(history, self._encoder, self.decode, self._stops, self._stats)
        self._writer = LogWriter(self._runner)
        self._windows = (
            None if window is None else WindowPath(window, self._runner, self._encoder, self._history, self._writer, self._stats)
        )
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
    def history(self) -> History:
        """The rewrite policy (module docstring), as :class:`~.hf_history.HistoryPolicy` applies it."""
        return self._history.history

    @property
    def window(self) -> int | None:
        """The fewest recent items the template runs over each turn (``None``: the whole
        conversation), as :class:`~.hf_window.WindowPath` applies it."""
        return self._windows.window if self._windows is not None else None

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
        tokenized by :class:`~.hf_encoding.TemplateEncoder`)."""
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
        return list(self._encoder.tok.encode(text, add_special_tokens=False).ids)

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
        return self._runner.render(chat_messages(instructions, items), chat_tools(tools), add_generation_prompt)

    def chat_messages(self, instructions: str | None, items: Sequence[Item]) -> list[dict[str, Any]]:
        """The conversation as the chat messages this renderer hands the template (arguments as
        objects; :func:`~.hf_messages.engine_messages` gives the wire form an engine's
        ``/tokenize`` or chat endpoint takes)."""
        return chat_messages(instructions, items)

    @staticmethod
    def chat_tools(tools: ToolSet) -> list[dict[str, Any]] | None:
        """The request's tools as the template (and an engine's chat endpoint) sees them."""
        return chat_tools(tools)

    def _typical_generation_prompt(self) -> array[int]:
        messages = [{"role": "user", "content": "x"}]
        try:
            text, full = self._runner.render_pair(messages, None)
        except RenderError:
            return array("I")
        _, gen, _ = self._encoder.generation(text, full)
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
                return self._runner.render(*plain, False) != self._runner.render(*probed, False)
            except RenderError:
                return True

        first = answer[:1]
        return changes((first, None), (first, tools)), changes((answer, tools), (called, tools))

    def begin(self, instructions: str | None, tools: ToolSet) -> TokenLog:
        """A log holding the header: the template's text for the instructions and tools alone
        (empty when the template cannot render them without messages)."""
        header = Header(instructions or None, chat_tools(tools))
        messages = self._runner.messages(header.instructions, [])
        piece = Piece(None, "", header)
        seg = array("I")
        try:
            text, prompt_text = self._runner.render_pair(messages, header.tools)
        except RenderError:
            pass
        else:
            seg = array("I", self._encoder.encode(text))
            piece.text = text
            piece.gen_text, piece.gen, piece.whole_prompt = self._encoder.generation(text, prompt_text)
        ctx = LogContext(self.name, self._key, self.fingerprint(instructions, tools))
        return TokenLog(Node(None, ctx, seg, 0, NO_FACTS, 0, data=piece))

    def render_full(self, instructions: str | None, tools: ToolSet, items: Sequence[Item]) -> TokenLog:
        return self.extend(self.begin(instructions, tools), items)

    def prompt(self, log: TokenLog) -> array[int]:
        """The log's tokens and the generation prompt the template gives after its last message."""
        piece = hf_log.piece(log._node)
        if piece.whole_prompt is not None:
            return array("I", piece.whole_prompt)
        if piece.gen is None:  # a header the template could not render alone
            chain = hf_log.chain(log._node)
            header = hf_log.piece(chain[0]).header
            assert header is not None
            messages = self._runner.messages(header.instructions, [hf_log.piece(n).item for n in chain[1:]])  # type: ignore[misc]
            return array("I", self._encoder.encode(self._runner.render(messages, header.tools, True)))
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
        if self._windows is not None:
            windowed = self._windows.extend(node, items, sampled)
            if windowed is not None:
                return windowed
        chain = hf_log.chain(node)
        pieces = [hf_log.piece(n) for n in chain]
        header = pieces[0].header
        assert header is not None
        old_items: list[Item] = [p.item for p in pieces[1:]]  # type: ignore[misc]
        old_text = "".join(p.text for p in pieces)
        all_items = [*old_items, *items]
        messages = self._runner.messages(header.instructions, all_items, first_new=len(old_items))
        text, prompt_text = self._runner.render_pair(messages, header.tools)
        self._stats.full_renders += 1
        if text.startswith(old_text):
            added = text[len(old_text) :]
            ids = self._encoder.after(old_text, added)
            if ids is not None:
                seg = self._history.keep_sampled(pieces[-1], added, sampled)
                gen = self._encoder.generation(text, prompt_text)
                return self._writer.append(node, items, added, array("I", ids) if seg is None else seg, gen)
            merged = self._merge_last_turn(chain, pieces, items, text, prompt_text)
            if merged is not None:
                return merged
        self._stats.rewinds += 1
        kept = self._keep_turns(chain, pieces, text)
        if kept is not None:
            start, ids = kept
            gen = self._encoder.generation(text, prompt_text)
            before = sum(len(p.text) for p in pieces[:start])
            return self._writer.append(chain[start - 1], all_items[start - 1 :], text[before:], array("I", ids), gen)
        return self._rebuild(chain[0], all_items, text, prompt_text)

    def _keep_turns(self, chain: list[Node], pieces: list[Piece], text: str) -> tuple[int, list[int]] | None:
        """After a rewrite: the last turn start (an index into ``chain``) whose earlier text the
        new text still begins with, and the tokens of the new text from there; None if none."""
        old = "".join(p.text for p in pieces)
        low = common_prefix_length(old, text)
        offset = sum(len(p.text) for p in pieces)
        for k in range(len(chain) - 1, 0, -1):
            offset -= len(pieces[k].text)
            if chain[k].flags & JOINED or offset > low:
                continue
            ids = self._history.retokenize(chain[k:], old[:offset], text[offset:])
            if ids is not None:
                return k, ids
        return None

    # -- machinery ----------------------------------------------------------------------------

    def _merge_last_turn(
        self, chain: list[Node], pieces: list[Piece], items: Sequence[Item], text: str, prompt_text: str
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
        ids = self._encoder.after(before, text[len(before) :])
        if ids is None:
            return None
        self._stats.turns_merged += 1
        turn = [p.item for p in pieces[start:]]
        gen = self._encoder.generation(text, prompt_text)
        return self._writer.append(chain[start - 1], [*turn, *items], text[len(before) :], array("I", ids), gen)  # type: ignore[list-item]

    def _rebuild(self, root: Node, items: Sequence[Item], text: str, prompt_text: str) -> TokenLog:
        """A log of ``text`` tokenized afresh, reusing the header when it is still a prefix."""
        head = hf_log.piece(root)
        if not text.startswith(head.text):
            assert head.header is not None
            root = Node(None, root.ctx, array("I"), 0, NO_FACTS, 0, data=Piece(None, "", head.header))
            head = hf_log.piece(root)
        ids = self._encoder.after(head.text, text[len(head.text) :]) if head.text else self._encoder.encode(text)
        if ids is None:
            assert head.header is not None
            root = Node(None, root.ctx, array("I"), 0, NO_FACTS, 0, data=Piece(None, "", head.header))
            ids = self._encoder.encode(text)
            head = hf_log.piece(root)
        return self._writer.append(root, items, text[len(head.text) :], array("I", ids), self._encoder.generation(text, prompt_text))

