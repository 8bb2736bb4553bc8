"""A Hugging Face model's tokenizer and chat template, read from its files (no ``transformers``).

:func:`load_model_files` finds a model directory -- a local directory with ``tokenizer.json``, a
Hugging Face cache entry (``.../models--org--name``), or a model id (``org/name``) already in the
local cache -- and reads what rendering needs: the ``tokenizers`` tokenizer, the chat template
(``chat_template.jinja``, else ``chat_template`` in ``tokenizer_config.json``), the special tokens
the template sees (``bos_token``, ``eos_token``…) and the end-of-turn ids
(``generation_config.json``'s ``eos_token_id`` too). Nothing is downloaded.

:func:`compile_template` compiles the template the way ``transformers.apply_chat_template`` does:
a sandboxed jinja2 environment with ``trim_blocks``/``lstrip_blocks``, the loop-controls
extension, the ``{% generation %}`` tag, a ``tojson`` filter that keeps non-ASCII text and takes
``indent``/``separators``/``sort_keys``, and the globals ``raise_exception``, ``strftime_now``,
``dict`` and ``namespace`` (which refuses underscore-prefixed attributes). The result, a
:class:`ChatTemplate`, gives the text with and without the generation prompt from one run of the
template when its syntax tree shows that the generation prompt can only be appended at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import VocabularyError

if TYPE_CHECKING:
    import jinja2
    import jinja2.nodes
    from tokenizers import Tokenizer

#: The special-token attributes ``apply_chat_template`` hands the template.
TEMPLATE_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


class ModelFilesError(VocabularyError):
    """A model directory is missing, or lacks a readable ``tokenizer.json`` or chat template."""


@dataclass(frozen=True)
class ModelFiles:
    """What the ``hf`` renderer reads from a model directory."""

    path: Path
    tokenizer_json: str
    chat_template: str
    #: ``bos_token``, ``eos_token``, ``unk_token``, ``pad_token`` -> token text (those set).
    template_tokens: dict[str, str]
    #: Token ids ``generation_config.json`` lists as ``eos_token_id`` (may be empty).
    generation_eos: tuple[int, ...]
    #: ``vocab_size`` of ``config.json`` (the ids an engine may sample; 0 when unknown).
    vocab_size: int = 0

    @property
    def digest(self) -> str:
        """A short digest of the tokenizer and the template (part of the renderer's key)."""
        h = hashlib.blake2b(digest_size=8)
        h.update(self.tokenizer_json.encode())
        h.update(b"\x00")
        h.update(self.chat_template.encode())
        h.update(json.dumps(self.template_tokens, sort_keys=True).encode())
        return h.hexdigest()

    def tokenizer(self) -> Tokenizer:
        """A new ``tokenizers.Tokenizer`` from ``tokenizer.json``."""
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - the hf extra installs it
            raise ModelFilesError("the hf renderer needs the 'tokenizers' package: pip install 'responses-cache[hf]'") from exc
        return Tokenizer.from_str(self.tokenizer_json)


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content": …}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _hub_cache() -> Path:
    cache = os.environ.get("HF_HUB_CACHE")
    if cache:
        return Path(cache)
    home = os.environ.get("HF_HOME")
    return Path(home) / "hub" if home else Path.home() / ".cache" / "huggingface" / "hub"


def _snapshot(entry: Path) -> Path | None:
    """The snapshot directory of a cache entry ``models--org--name`` (``refs/main``, else the
    only or newest snapshot)."""
    snapshots = entry / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = entry / "refs" / "main"
    if ref.is_file():
        chosen = snapshots / ref.read_text().strip()
        if chosen.is_dir():
            return chosen
    dirs = sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return dirs[-1] if dirs else None


def resolve_model_dir(spec: str) -> Path:
    """The directory holding ``tokenizer.json`` for ``spec`` (a path or a cached model id)."""
    path = Path(spec).expanduser()
    candidates: list[Path] = []
    if path.is_dir():
        candidates.append(path)
        snap = _snapshot(path)
        if snap is not None:
            candidates.append(snap)
    elif "/" in spec and not spec.startswith(("/", ".", "~")):
        snap = _snapshot(_hub_cache() / ("models--" + spec.replace("/", "--")))
        if snap is not None:
            candidates.append(snap)
    for candidate in candidates:
        if (candidate / "tokenizer.json").is_file():
            return candidate
    raise ModelFilesError(
        f"no tokenizer.json for {spec!r}: give a model directory (or a Hugging Face cache entry, "
        "or the id of a model already in the local cache) holding tokenizer.json and a chat template"
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFilesError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def load_model_files(spec: str, *, chat_template: str | None = None) -> ModelFiles:
    """Read the model directory ``spec`` (see :func:`resolve_model_dir`); ``chat_template``
    overrides the model's own template (a path to a ``.jinja`` file or the template text)."""
    directory = resolve_model_dir(spec)
    try:
        tokenizer_json = (directory / "tokenizer.json").read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelFilesError(f"cannot read {directory / 'tokenizer.json'}: {exc}") from exc
    config = _read_json(directory / "tokenizer_config.json")
    template: str | None = None
    if chat_template is not None:
        override = Path(chat_template).expanduser()
        template = override.read_text(encoding="utf-8") if "{" not in chat_template and override.is_file() else chat_template
    elif (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
    else:
        raw = config.get("chat_template")
        if isinstance(raw, list):  # named templates: [{"name": "default", "template": …}, …]
            named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
            raw = named.get("default")
        template = raw if isinstance(raw, str) else None
    if not template:
        raise ModelFilesError(
            f"{directory} has no chat template (chat_template.jinja or chat_template in "
            "tokenizer_config.json); pass one with chat_template="
        )
    tokens = {key: text for key in TEMPLATE_TOKENS if (text := _token_text(config.get(key))) is not None}
    generation = _read_json(directory / "generation_config.json").get("eos_token_id")
    eos_ids = (generation,) if isinstance(generation, int) else tuple(i for i in generation or () if isinstance(i, int))
    vocab_size = _read_json(directory / "config.json").get("vocab_size")
    return ModelFiles(directory, tokenizer_json, template, tokens, eos_ids, vocab_size if isinstance(vocab_size, int) else 0)


# -- the template environment ----------------------------------------------------------------


class FrozenJSON:
    """The template's ``tojson`` filter, remembering its text for the objects the renderer passes
    to :meth:`freeze`: objects it builds once, hands the template turn after turn and never changes
    (the tool definitions, parsed call arguments). Why remembering is exact: the text is a function
    of the object's contents; the renderer never changes a frozen object; the template cannot (the
    immutable sandbox refuses every method that changes a ``dict`` or ``list``, and jinja has no
    item assignment); and an entry holds the object, so its ``id`` is not reused while the entry
    lives. Anything else (the messages, objects the template builds) is dumped every time.
    ``calls`` counts the filter's uses, ``dumps`` the JSON texts actually computed."""

    def __init__(self, size: int = 4096) -> None:
        from collections import OrderedDict

        self._size = size
        self._memo: OrderedDict[int, tuple[Any, dict[tuple[Any, ...], str]]] = OrderedDict()
        self.calls = 0
        self.dumps = 0

    def freeze(self, value: Any, *, deep: bool = False) -> None:
        """Remember ``value``'s JSON texts from now on (the caller never changes it again);
        ``deep``: the dicts and lists inside it too (when it is new here)."""
        key = id(value)
        entry = self._memo.get(key)
        if entry is not None and entry[0] is value:
            self._memo.move_to_end(key)
            return
        self._memo[key] = (value, {})
        if len(self._memo) > self._size:
            self._memo.popitem(last=False)
        if deep:
            for inner in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
                if isinstance(inner, (dict, list)):
                    self.freeze(inner, deep=True)

    def __call__(self, value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
                 sort_keys: bool = False) -> str:
        self.calls += 1
        entry = self._memo.get(id(value))
        if entry is None or entry[0] is not value:
            self.dumps += 1
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        options = (ensure_ascii, indent, None if separators is None else tuple(separators), sort_keys)
        text = entry[1].get(options)
        if text is None:
            self.dumps += 1
            text = entry[1][options] = json.dumps(
                value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
            )
        return text


#: The variable a template's final generation-prompt block is captured in (see :class:`ChatTemplate`).
_CAPTURE = "responses_cache_generation_prompt"
_GENERATION = "add_generation_prompt"


def _final_generation_block(tree: jinja2.nodes.Template) -> bool:
    """Whether ``add_generation_prompt`` is read only by the template's last top-level statement,
    an ``{% if add_generation_prompt [and …] %}`` without ``elif``/``else``: then the text with the
    generation prompt is the text without it plus what that block outputs (with the flag false,
    the test short-circuits to false and the block outputs nothing; nothing earlier reads it)."""
    import jinja2.nodes as n

    uses = [node for node in tree.find_all(n.Name) if node.name == _GENERATION]
    if not uses or not tree.body:
        return False
    last = tree.body[-1]
    if not isinstance(last, n.If) or last.elif_ or last.else_:
        return False
    if sum(1 for node in last.find_all(n.Name) if node.name == _GENERATION) != len(uses):
        return False
    test = last.test
    while isinstance(test, n.And):
        test = test.left
    return isinstance(test, n.Name) and test.name == _GENERATION


def _constant_tail(tree: jinja2.nodes.Template) -> bool:
    """Whether the template's last top-level statement outputs constant text (Llama 3's original
    template ends every rendering with the assistant header, ``add_generation_prompt`` or not)."""
    import jinja2.nodes as n

    last = tree.body[-1] if tree.body else None
    return isinstance(last, n.Output) and all(isinstance(node, (n.TemplateData, n.Const)) for node in last.nodes)


class ChatTemplate:
    """A compiled chat template. :meth:`render` runs it as ``apply_chat_template`` does;
    :meth:`render_pair` gives the text without and with the generation prompt -- from one run when
    the template does not read ``add_generation_prompt`` at all, or reads it only in a final
    ``{% if add_generation_prompt [and …] %}`` block (checked on the syntax tree, see
    :func:`_final_generation_block`): that block's output is captured in a variable instead of the
    text. Any other template is run twice.

    A template that does not read the flag but ends with constant text (:func:`_constant_tail`)
    writes it after every conversation, so a conversation's text would not be the start of the
    next turn's (the constant sits between them): that text is captured too, and counts as the
    generation prompt. :meth:`text` is the text without it, what the token log holds; the
    prompt is unchanged (the log's text followed by the constant is the template's whole text)."""

    def __init__(self, env: jinja2.Environment, source: str, tojson: FrozenJSON | None = None) -> None:
        import jinja2.nodes as n

        #: The environment's ``tojson`` filter (:meth:`FrozenJSON.freeze` objects handed to it).
        self.json = tojson if tojson is not None else FrozenJSON()
        self.template = env.from_string(source)
        tree = env.parse(source)
        self.reads_generation_flag = any(node.name == _GENERATION for node in tree.find_all(n.Name))
        #: The template with its final generation block, or its constant tail, captured (None:
        #: neither).
        self._split: jinja2.Template | None = None
        if _final_generation_block(tree) or (not self.reads_generation_flag and _constant_tail(tree)):
            block = tree.body[-1]
            capture = n.AssignBlock(n.Name(_CAPTURE, "store"), None, [block]).set_lineno(block.lineno)
            tree.body[-1] = capture
            tree.set_environment(env)
            self._split = env.from_string(tree)

    @property
    def one_run(self) -> bool:
        """Whether :meth:`render_pair` runs the template once."""
        return self._split is not None or not self.reads_generation_flag

    def render(self, add_generation_prompt: bool, variables: dict[str, Any]) -> str:
        return str(self.template.render(variables, add_generation_prompt=add_generation_prompt))

    def text(self, variables: dict[str, Any]) -> str:
        """The text without the generation prompt (and without a constant tail): the first of
        :meth:`render_pair`, from one run."""
        if self._split is not None:
            return str(self._split.make_module({**variables, _GENERATION: False}))
        return self.render(False, variables)

    def render_pair(self, variables: dict[str, Any]) -> tuple[str, str]:
        """(the text without the generation prompt, the text with it)."""
        if self._split is not None:
            module = self._split.make_module({**variables, _GENERATION: True})
            text = str(module)
            return text, text + str(getattr(module, _CAPTURE, ""))
        text = self.text(variables)
        return text, (self.render(True, variables) if self.reads_generation_flag else text)


def compile_template(source: str) -> ChatTemplate:
    """``source`` compiled in a sandboxed environment equivalent to ``apply_chat_template``'s
    (:mod:`.hf_sandbox`)."""
    try:
        import jinja2

        from . import hf_sandbox
    except ImportError as exc:  # pragma: no cover - the hf extra installs it
        raise ModelFilesError("the hf renderer needs the 'jinja2' package: pip install 'responses-cache[hf]'") from exc
    tojson = FrozenJSON()
    try:
        return ChatTemplate(hf_sandbox.environment(tojson), source, tojson)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ModelFilesError(f"the chat template does not compile: {exc}") from exc
