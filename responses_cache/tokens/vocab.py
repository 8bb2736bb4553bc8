"""Offline, hash-verified tokenizer vocabularies.

``load_encoding(name)`` builds a :class:`tiktoken.Encoding` without touching the network: the BPE
ranks come from the gzipped ``*.tiktoken`` files shipped in ``responses_cache/vocab/`` (byte
identical to OpenAI's published files once gunzipped), or from a local directory named by the
``vocab_dir`` argument or the ``RESPONSES_CACHE_VOCAB_DIR`` environment variable. Every file is
checked against the sha256 that tiktoken itself pins, and each encoding is built once per
process.

The regex and special-token tables below are copies of ``tiktoken_ext/openai_public.py``
(tiktoken 0.14); a test checks that they still equal tiktoken's own constructors.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.resources
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import tiktoken

from .errors import VocabularyError

#: Environment variable naming a directory of ``*.tiktoken`` (or ``*.tiktoken.gz``) files.
VOCAB_DIR_ENV = "RESPONSES_CACHE_VOCAB_DIR"

_ENDOFTEXT = "<|endoftext|>"
_ENDOFPROMPT = "<|endofprompt|>"

_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


@dataclass(frozen=True)
class _VocabFile:
    filename: str
    sha256: str


_FILES: dict[str, _VocabFile] = {
    "cl100k_base": _VocabFile(
        "cl100k_base.tiktoken", "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
    ),
    "o200k_base": _VocabFile(
        "o200k_base.tiktoken", "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
    ),
}


def _harmony_specials() -> dict[str, int]:
    specials = {
        _ENDOFTEXT: 199999,
        _ENDOFPROMPT: 200018,
        "<|startoftext|>": 199998,
        "<|reserved_200000|>": 200000,
        "<|reserved_200001|>": 200001,
        "<|return|>": 200002,
        "<|constrain|>": 200003,
        "<|reserved_200004|>": 200004,
        "<|channel|>": 200005,
        "<|start|>": 200006,
        "<|end|>": 200007,
        "<|message|>": 200008,
        "<|reserved_200009|>": 200009,
        "<|reserved_200010|>": 200010,
        "<|reserved_200011|>": 200011,
        "<|call|>": 200012,
    }
    specials.update({f"<|reserved_{i}|>": i for i in range(200013, 201088)})
    return specials


@dataclass(frozen=True)
class _EncodingSpec:
    base: str  # which vocabulary file holds the BPE ranks
    pat_str: str
    special_tokens: dict[str, int]


_SPECS: dict[str, _EncodingSpec] = {
    "cl100k_base": _EncodingSpec(
        "cl100k_base",
        _CL100K_PAT,
        {
            _ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            _ENDOFPROMPT: 100276,
        },
    ),
    "o200k_base": _EncodingSpec("o200k_base", _O200K_PAT, {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018}),
    "o200k_harmony": _EncodingSpec("o200k_base", _O200K_PAT, _harmony_specials()),
}

#: ChatML delimiters added on top of an encoding (the ids OpenAI used for gpt-3.5/4 and gpt-4o).
CHATML_SPECIALS: dict[str, dict[str, int]] = {
    "cl100k_base": {"<|im_start|>": 100264, "<|im_end|>": 100265, "<|im_sep|>": 100266},
    "o200k_base": {"<|im_start|>": 200264, "<|im_end|>": 200265, "<|im_sep|>": 200266},
}

#: Names accepted by :func:`load_encoding`.
ENCODING_NAMES: tuple[str, ...] = tuple(_SPECS)

_lock = threading.Lock()
_ranks_cache: dict[tuple[str, str], dict[bytes, int]] = {}
_encoding_cache: dict[tuple[str, str, bool], tiktoken.Encoding] = {}
# (name, vocab_dir argument, env value, chatml) -> encoding: repeated calls skip re-hashing.
_request_cache: dict[tuple[str, str | None, str | None, bool], tiktoken.Encoding] = {}


def _read_vocab(base: str, vocab_dir: str | os.PathLike[str] | None) -> tuple[bytes, str]:
    """The verified, uncompressed bytes of ``base``'s vocabulary file and where they came from."""
    spec = _FILES[base]
    directory = vocab_dir if vocab_dir is not None else (os.environ.get(VOCAB_DIR_ENV) or None)
    if directory is not None:
        root = Path(directory)
        candidates = [root / spec.filename, root / (spec.filename + ".gz")]
        for path in candidates:
            if path.is_file():
                try:
                    raw = path.read_bytes()
                    data = gzip.decompress(raw) if path.suffix == ".gz" else raw
                except (OSError, EOFError, gzip.BadGzipFile) as exc:
                    raise VocabularyError(f"cannot read tokenizer vocabulary {path}: {exc}") from exc
                _verify(data, spec, str(path))
                return data, str(path)
        source = "vocab_dir argument" if vocab_dir is not None else f"${VOCAB_DIR_ENV}"
        tried = ", ".join(str(p) for p in candidates)
        raise VocabularyError(
            f"tokenizer vocabulary {spec.filename!r} not found in {directory} (from the {source}); "
            f"tried {tried}. Copy OpenAI's {spec.filename} (sha256 {spec.sha256}) there, "
            f"or unset {VOCAB_DIR_ENV} to use the copy bundled with responses-cache."
        )
    resource = importlib.resources.files("responses_cache").joinpath("vocab").joinpath(spec.filename + ".gz")
    try:
        data = gzip.decompress(resource.read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise VocabularyError(
            f"bundled tokenizer vocabulary {resource} is missing or unreadable ({exc}); "
            f"reinstall responses-cache or set {VOCAB_DIR_ENV} to a directory holding {spec.filename}"
        ) from exc
    _verify(data, spec, str(resource))
    return data, f"package:{spec.filename}.gz"


def _verify(data: bytes, spec: _VocabFile, where: str) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise VocabularyError(
            f"tokenizer vocabulary {where} fails its hash check: sha256 {digest}, expected "
            f"{spec.sha256} ({spec.filename} as published by OpenAI)"
        )


def _parse_ranks(data: bytes, where: str) -> dict[bytes, int]:
    try:
        return {
            base64.b64decode(token): int(rank)
            for token, rank in (line.split() for line in data.splitlines() if line)
        }
    except ValueError as exc:  # pragma: no cover - the hash check makes this unreachable
        raise VocabularyError(f"malformed tokenizer vocabulary {where}: {exc}") from exc


def _ranks(base: str, vocab_dir: str | os.PathLike[str] | None) -> tuple[dict[bytes, int], str]:
    data, where = _read_vocab(base, vocab_dir)
    key = (base, where)
    ranks = _ranks_cache.get(key)
    if ranks is None:
        ranks = _ranks_cache[key] = _parse_ranks(data, where)
    return ranks, where


def _load(name: str, vocab_dir: str | os.PathLike[str] | None, chatml: bool) -> tiktoken.Encoding:
    spec = _SPECS.get(name)
    if spec is None:
        raise ValueError(f"unknown encoding {name!r}; expected one of {', '.join(ENCODING_NAMES)}")
    if chatml and name not in CHATML_SPECIALS:
        raise ValueError(
            f"ChatML is not defined for encoding {name!r}; use one of {', '.join(CHATML_SPECIALS)}"
        )
    request = (
        name,
        None if vocab_dir is None else os.fspath(vocab_dir),
        os.environ.get(VOCAB_DIR_ENV) or None,
        chatml,
    )
    cached = _request_cache.get(request)
    if cached is not None:
        return cached
    with _lock:
        # A new (argument, environment) combination resolves the file again and checks its
        # hash; parsing the ranks and building the BPE happen once per source file.
        ranks, where = _ranks(spec.base, vocab_dir)
        key = (name, where, chatml)
        enc = _encoding_cache.get(key)
        if enc is None:
            specials = dict(spec.special_tokens)
            if chatml:
                specials.update(CHATML_SPECIALS[name])
            enc = tiktoken.Encoding(
                name=f"{name}+chatml" if chatml else name,
                pat_str=spec.pat_str,
                mergeable_ranks=ranks,
                special_tokens=specials,
            )
            _encoding_cache[key] = enc
        _request_cache[request] = enc
        return enc


def load_encoding(name: str, vocab_dir: str | os.PathLike[str] | None = None) -> tiktoken.Encoding:
    """Load ``"o200k_harmony"``, ``"o200k_base"`` or ``"cl100k_base"`` offline.

    The vocabulary is read from ``vocab_dir`` if given, else from ``$RESPONSES_CACHE_VOCAB_DIR``
    if set, else from the copy bundled with the package; a file there may be plain
    (``o200k_base.tiktoken``) or gzipped (``o200k_base.tiktoken.gz``). Raises
    :class:`VocabularyError` when the file is missing or its sha256 differs from OpenAI's.
    The result is cached per process (per name and source file).
    """
    return _load(name, vocab_dir, chatml=False)


def load_chatml_encoding(
    name: str, vocab_dir: str | os.PathLike[str] | None = None
) -> tiktoken.Encoding:
    """Like :func:`load_encoding` plus the ``<|im_start|>``/``<|im_end|>``/``<|im_sep|>`` specials."""
    return _load(name, vocab_dir, chatml=True)


def vocab_source(name: str, vocab_dir: str | os.PathLike[str] | None = None) -> str:
    """Where :func:`load_encoding` would read ``name``'s vocabulary from (verifies the hash)."""
    spec = _SPECS.get(name)
    if spec is None:
        raise ValueError(f"unknown encoding {name!r}; expected one of {', '.join(ENCODING_NAMES)}")
    return _read_vocab(spec.base, vocab_dir)[1]
