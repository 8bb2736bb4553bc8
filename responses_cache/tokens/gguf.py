"""The ``gguf`` renderer: a GGUF file's own tokenizer and chat template (``renderer = "gguf:<file>"``).

A GGUF file (llama.cpp's model format) carries the tokenizer -- its vocabulary, merges, token
types, special token ids and the name of its pre-tokenizer -- and the chat template in its
metadata. :func:`model_dir` reads that metadata (:func:`read_metadata`, with the ``gguf`` package:
the tensors are never read) and writes the model directory the ``hf`` renderer takes
(``tokenizer.json``, ``tokenizer_config.json`` with the template, ``generation_config.json`` with
the end ids) into a cache (:func:`cache_root`), once per file; the renderer is then an :class:`~.hf.HFRenderer` of that
directory: the same incremental rendering, the template applied as ``llama-server`` applies it
(``/apply-template``), the ids tokenized as its ``/tokenize`` gives them.

The tokenizer is rebuilt the way llama.cpp runs it, not the way the original files did: no
normalizer (llama.cpp applies none), the pre-tokenizer of the GGUF's ``tokenizer.ggml.pre`` (the
splitting expressions llama.cpp uses for that name, :data:`PRE_TOKENIZERS`), byte-level BPE with
the GGUF's merges, and every control or user-defined token as an added token (llama.cpp splits
those out of the text before BPE, as ``tokenizers`` does with added tokens). Byte-level BPE
vocabularies (``tokenizer.ggml.model = "gpt2"``: Qwen, Llama 3, DeepSeek, …) are supported;
SentencePiece ones (``"llama"``: Mistral, Gemma, …) are refused with the way out (``hf:`` with the
model's own files). An adapter's tokenizer handshake against the server (``/tokenize``) proves
the ids at start.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import VocabularyError

#: ``renderer = "gguf:<file>"``.
GGUF_PREFIX = "gguf:"

_QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_DEEPSEEK3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",  # CJK ideographs, hiragana, katakana
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)
#: ``tokenizer.ggml.pre`` -> the splitting expressions, applied in turn (each isolates its matches).
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2"), (_QWEN2,)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"), (_LLAMA3,)),
    **dict.fromkeys(("deepseek-v3", "joyai-llm"), _DEEPSEEK3),
}

# GGUF token types.
_CONTROL, _USER_DEFINED = 3, 4


class GGUFError(VocabularyError):
    """Not a GGUF file, or one whose tokenizer this renderer cannot rebuild."""


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The key-value metadata of a GGUF file, read with llama.cpp's own ``gguf`` package (the
    ``gguf`` extra): the header only, the tensors are mapped but never read."""
    try:
        from gguf import GGUFReader  # the gguf extra: imported only for a gguf: renderer
    except ImportError as exc:
        raise GGUFError("the gguf: renderer needs the gguf package: pip install 'responses-cache[gguf]'") from exc
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError) as exc:
        raise GGUFError(f"{path} is not a GGUF file this renderer can read: {exc}") from exc
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def tokenizer_files(metadata: dict[str, Any], source: str = "the GGUF file") -> dict[str, Any]:
    """The ``hf`` renderer's files (name -> JSON document) for the GGUF's tokenizer and template."""
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFError(
            f"{source} has a {model!r} tokenizer: gguf: renders byte-level BPE vocabularies "
            "(tokenizer.ggml.model 'gpt2'); use hf:<the model's directory> instead"
        )
    pre = str(metadata.get("tokenizer.ggml.pre") or "default")
    splits = PRE_TOKENIZERS.get(pre)
    if splits is None:
        raise GGUFError(
            f"{source}: the pre-tokenizer {pre!r} is not known here (known: {', '.join(sorted(PRE_TOKENIZERS))}); "
            "use hf:<the model's directory> instead"
        )
    template = metadata.get("tokenizer.chat_template")
    if not isinstance(template, str) or not template:
        raise GGUFError(f"{source} has no chat template (tokenizer.chat_template)")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges: list[str] = list(metadata.get("tokenizer.ggml.merges") or ())
    added = [
        {"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": kind == _CONTROL}
        for i, (token, kind) in enumerate(zip(tokens, types, strict=False)) if kind in (_CONTROL, _USER_DEFINED)
    ]
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            *({"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False} for split in splits),
            byte_level,
        ]},
        "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }

    def text(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None

    config: dict[str, Any] = {"chat_template": template}
    for key in ("bos", "eos", "unk"):
        if (found := text(key)) is not None:
            config[f"{key}_token"] = found
    if (pad := text("padding")) is not None:
        config["pad_token"] = pad
    ends = [metadata.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
    generation = {"eos_token_id": [i for i in dict.fromkeys(ends) if isinstance(i, int)]}
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config, "generation_config.json": generation,
            "config.json": {"vocab_size": len(tokens)}}


def cache_root() -> Path:
    """Where the model directories made from GGUF files are kept: ``gguf/`` under
    ``$RESPONSES_CACHE_DIR``, else ``$XDG_CACHE_HOME/responses-cache``, else
    ``~/.cache/responses-cache`` (as the hf renderer's verdicts)."""
    configured = os.environ.get("RESPONSES_CACHE_DIR")
    if configured:
        return Path(configured) / "gguf"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "responses-cache" / "gguf"


def model_dir(path: str | os.PathLike[str]) -> Path:
    """The model directory made from the GGUF file ``path`` (made once, then cached by the file's
    path, size and modification time)."""
    source = Path(path).expanduser().resolve()
    try:
        stat = source.stat()
    except OSError as exc:
        raise GGUFError(f"cannot read the GGUF file {source}: {exc}") from exc
    key = hashlib.blake2b(f"{source}\0{stat.st_size}\0{stat.st_mtime_ns}".encode(), digest_size=12).hexdigest()
    out = cache_root() / f"{source.stem}-{key}"
    if (out / "tokenizer.json").is_file():
        return out
    files = tokenizer_files(read_metadata(source), str(source))
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{source.stem}-", dir=out.parent))
    for name, document in files.items():
        (scratch / name).write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    try:
        scratch.rename(out)
    except OSError:  # another process made it first
        for child in scratch.iterdir():
            child.unlink()
        scratch.rmdir()
    return out
