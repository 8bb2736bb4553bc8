"""A tiktoken encoder for a byte-level BPE ``tokenizer.json``, used only where it provably gives
the ``tokenizers`` library's ids.

The ``hf`` renderer tokenizes template text with the model's own tokenizer. ``tokenizers`` runs its
pre-tokenizer regex in Oniguruma and its BPE per word in a heap; ``tiktoken`` runs the same kind of
regex in Rust's ``regex`` and a simpler merge loop, several times faster. This module builds a
``tiktoken.Encoding`` from ``tokenizer.json`` and accepts it only when equality with ``tokenizers``
can be argued, step by step:

**BPE** (:func:`plan`, :func:`verify_merges`). ``tokenizers`` merges, in a word, the adjacent pair
with the lowest merge priority among pairs in the merge list (leftmost on ties); tiktoken merges
the adjacent pair whose concatenation has the lowest rank among pairs whose concatenation is in its
ranks (leftmost on ties), and returns a whole word that is in its ranks as one token. The ranks
built here are the 256 single bytes and each merge's result ``t``, ranked by the priority of the
merge ``tokenizers`` applies *last* when it BPE-encodes ``t`` alone (merges only): ``t``'s only
merge, or, for a token several merges produce (vocabularies converted from tiktoken's ranks list
every split of a token: Llama 3's has 90,639 such tokens), the one :func:`alone` finds by running
that BPE. They agree when

(a) no merge is listed twice, and each merge's result, run alone through that BPE, ends at
    ``[t]`` or at three or more pieces (checked while planning), and
(b) every ranked multi-byte token, BPE-encoded alone by ``tokenizers`` (merges only), gives the
    pieces the plan expects: ``[t]``, or that run's end (checked by encoding all of them with a
    merges-only copy of the model).

Proof sketch: take a word both algorithms have brought to the same pieces. If two adjacent pieces
``x, y`` concatenate to a ranked ``t``, the merges inside ``t``'s span all happened inside it (the
span is exactly covered), and each was the lowest of the word's pairs, hence of the span's (and
the leftmost of the lowest in the span): the span went through the states ``tokenizers`` goes
through on ``t`` alone. That run has one two-piece state at most, and if it ends at ``[t]``, its
next merge joins it: ``(x, y)`` is the merge it applies last, whose priority is ``t``'s rank. If
it ends at three pieces or more it has no two-piece state with an applicable merge, and one with
none would be its end, so ``x, y`` cannot be adjacent. Conversely every merge's pair concatenates
to a ranked token, and when adjacent it is, by the same argument, that token's last merge. So both
see the same candidate pairs with the same priorities and pick the same one, to the end. With (b)
a word that is itself a ranked token ending at ``[t]`` comes out whole either way (tiktoken's
shortcut, or ``ignore_merges``). A token whose run alone ends at three pieces or more is never a
candidate: it is ranked (above every merge) only under ``ignore_merges``, for a word that is
itself that token. Multi-byte vocabulary tokens without a merge are left out of the ranks when
``ignore_merges`` is off (``tokenizers`` never produces them); with it on they are refused.

**Added tokens**: ``tokenizers`` splits them out before anything else (leftmost-longest; the
``normalized`` ones in a second pass in what is left); here one leftmost-longest scan finds them
all (a trie-shaped pattern, :func:`literals_pattern`; not tiktoken's special-token scan, which
is leftmost-first and slow with DeepSeek's thousand), and tiktoken encodes the text between them.
Accepted when no normalized occurrence can reach into a raw one (:func:`added_tokens_agree`),
with no ``lstrip``/``rstrip``/``single_word``, and ``normalized`` ones only without a normalizer.

**Normalizer**: none, or NFC. With NFC, text between added tokens that is not already NFC goes to
``tokenizers`` (``unicodedata.is_normalized``, per piece; the normalizer runs on those pieces).

**Pre-tokenizer**: ``Split(regex, "Isolated")`` then ``ByteLevel(use_regex=false)``, or
``ByteLevel(use_regex=true)`` (GPT-2's pattern), without ``add_prefix_space``: the regex becomes
tiktoken's pattern. Regex engines differ (Oniguruma and Rust's ``regex`` on Unicode classes, case
folding), so a load-time probe (:data:`PROBE`: every whitespace class, digits of many scripts, CJK,
emoji and ZWJ sequences, combining marks, contractions in odd cases, a sweep of the BMP) must give
the same ids as ``tokenizers``. ``Split`` keeps text its regex does not match as a piece of its
own, tiktoken drops it: every encode checks that the tokens' bytes are the text's
(:meth:`FastEncoder.encode` returns None otherwise, and the caller uses ``tokenizers``).

Any other shape (several ``Split`` steps, as DeepSeek V3's; a Metaspace/SentencePiece model;
dropout, prefixes, suffixes) is refused with a reason and ``tokenizers`` is used. (b) and the probe
cost about a second per 100k-token vocabulary; their verdict is cached on disk by the hash of
``tokenizer.json`` and the library versions (:func:`fast_encoder`'s ``cache_dir``).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tiktoken
from cachetools import LRUCache

if TYPE_CHECKING:
    from tokenizers import Tokenizer

#: GPT-2's pre-tokenizer, what ``ByteLevel(use_regex=true)`` splits with.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
#: DeepSeek V3's three ``Split`` steps (digits, then kana and CJK ideographs, then the rest).
_DEEPSEEK_STEPS = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)
_K = "\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff"
#: The same splits as one pattern. A digit run's pieces (up to three digits) pass the later steps
#: unchanged (no alternative of the third matches a digit). Within a kana/ideograph run only the
#: third step's letter and punctuation alternatives can match, restricted to the run's characters
#: (K). Elsewhere the third step's alternatives, their classes less digits and K, and its
#: ``(?!\S)``, which at the end of a piece sees the end, becomes "not followed by anything but
#: whitespace, a digit or K" (the characters a piece can end at).
DEEPSEEK_PATTERN = (
    r"\p{N}{1,3}"
    rf"|[{_K}&&[^\r\n\p{{L}}\p{{P}}\p{{S}}]]?[{_K}&&[\p{{L}}\p{{M}}]]+"
    rf"|[{_K}&&[\p{{P}}\p{{S}}]]+"
    r"|[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
    rf"|[^\r\n\p{{L}}\p{{P}}\p{{S}}\p{{N}}{_K}]?[\p{{L}}\p{{M}}&&[^{_K}]]+"
    rf"| ?[\p{{P}}\p{{S}}&&[^{_K}]]+[\r\n]*"
    r"|\s*[\r\n]+"
    rf"|\s+(?![^\s\p{{N}}{_K}])"
    r"|\s+"
)


def literals_pattern(words: Collection[str]) -> str:
    """A regular expression matching the longest of ``words`` that starts at a position (what an
    alternation of the words, longest first, matches), written as a trie so that ``re`` tries
    only the words that share the text's next character: a model's hundreds of added tokens cost
    one branch per character, not one comparison per token."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def pattern(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + pattern(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = "(?:" + "|".join(branches) + ")"
        return body + "?" if "" in node else body  # greedy: the longer word first

    return pattern(trie) or "(?!)"


class Refused(Exception):
    """The tokenizer's shape is not one the fast path provably reproduces (the message says why)."""


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character each byte is written as in ``tokenizer.json``."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


@dataclass(frozen=True)
class Plan:
    """What ``tokenizer.json`` says, mapped to tiktoken (before :func:`verify_merges` and the probe)."""

    pattern: str
    nfc: bool
    #: tiktoken's ranks (byte string -> tiktoken id) and special tokens (added token -> tiktoken id).
    ranks: dict[bytes, int]
    specials: dict[str, int]
    #: tiktoken id -> model id, or None when they are the same.
    to_model: list[int] | None
    #: The ranked multi-byte tokens as ``tokenizer.json`` writes them, with the model ids of the
    #: pieces ``tokenizers`` gives for each alone, merges only (the token's own id, but for a token
    #: whose run alone ends at three or more pieces): (b).
    merged: dict[str, list[int]] = field(repr=False)
    #: The tokens whose run alone (:func:`alone`) does not end with their first merge: the
    #: priority of the merge it applies last, or -1 where it does not end at the token (cached
    #: with the verdict).
    last: dict[str, int] = field(repr=False, default_factory=dict)


def _merge_pairs(merges: list[Any]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for m in merges:
        if isinstance(m, str):
            parts = m.split(" ")
            if len(parts) != 2:
                raise Refused(f"a merge that is not a pair: {m!r}")
            pairs.append((parts[0], parts[1]))
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m):
            pairs.append((m[0], m[1]))
        else:
            raise Refused(f"a merge that is not a pair: {m!r}")
    return pairs


def _pattern(pre: Any) -> str:
    """tiktoken's pattern for the pre-tokenizer, or Refused."""

    def byte_level(step: Any, use_regex: bool) -> bool:
        return (
            isinstance(step, dict)
            and step.get("type") == "ByteLevel"
            and not step.get("add_prefix_space", False)
            and bool(step.get("use_regex", True)) == use_regex
        )

    if byte_level(pre, True):
        return GPT2_PATTERN
    if isinstance(pre, dict) and pre.get("type") == "Sequence":
        steps = pre.get("pretokenizers") or []
        if (
            len(steps) == 4
            and byte_level(steps[3], False)
            and [_split_regex(s) for s in steps[:3]] == list(_DEEPSEEK_STEPS)
        ):
            return DEEPSEEK_PATTERN
        if len(steps) == 1 and byte_level(steps[0], True):
            return GPT2_PATTERN
        if len(steps) == 2 and byte_level(steps[1], False):
            regex = _split_regex(steps[0])
            if regex is not None:
                return regex
    raise Refused(f"pre-tokenizer not mapped: {json.dumps(pre)[:200]}")


def _split_regex(step: Any) -> str | None:
    """The regex of a ``Split`` step that keeps each match as a piece of its own, else None."""
    if not isinstance(step, dict) or step.get("type") != "Split":
        return None
    regex = (step.get("pattern") or {}).get("Regex")
    if (
        step.get("behavior") != "Isolated"
        or step.get("invert", False)
        or not isinstance(regex, str)
    ):
        return None
    return regex


def _nfc(normalizer: Any) -> bool:
    """Whether the normalizer is NFC (False: none); Refused for any other."""
    if normalizer is None:
        return False
    kind = normalizer.get("type") if isinstance(normalizer, dict) else None
    if kind == "NFC":
        return True
    if kind == "Sequence":
        steps = normalizer.get("normalizers") or []
        if not steps:
            return False
        if len(steps) == 1:
            return _nfc(steps[0])
    raise Refused(f"normalizer not mapped: {json.dumps(normalizer)[:200]}")


def _never_across(raw: list[str], normalized: list[str]) -> bool:
    """No occurrence of a ``normalized`` token can start at or before a ``raw`` one's and reach
    into it: no raw token is inside a normalized one, and no proper suffix of a normalized token
    starts a raw one."""
    starts = {r[:i] for r in raw for i in range(1, len(r) + 1)}
    return not any(r in n for r in raw for n in normalized) and not any(
        n[i:] in starts for n in normalized for i in range(1, len(n))
    )


def added_tokens_agree(raw: list[str], normalized: list[str]) -> bool:
    """Whether one leftmost-longest scan for all added tokens (:class:`FastEncoder`'s) finds what
    ``tokenizers`` does: it splits the ``normalized=false`` ones out first (leftmost-longest), then
    the others in what is left. They agree when no normalized occurrence can reach into a raw one
    from its left or around it (where both start, the longer wins in both: a raw one, since no
    raw token lies inside a normalized one): then skipping a normalized match never skips the
    start of a raw occurrence, so the one scan picks the raw occurrences the first pass does, and
    its normalized matches lie in the first pass's gaps, found there from the gap's start as the
    second pass finds them."""
    return _never_across(raw, normalized)


def alone(token: str, priority: dict[tuple[str, str], int]) -> tuple[list[str], int]:
    """``tokenizers``' BPE of ``token`` alone (``priority``: the merges, pair -> priority): the
    pieces it ends at, and the priority of the last merge it applied."""
    parts = list(token)
    last = -1
    while len(parts) > 1:
        best, at = -1, -1
        for i in range(len(parts) - 1):
            p = priority.get((parts[i], parts[i + 1]), -1)
            if p >= 0 and (best < 0 or p < best):
                best, at = p, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
        last = best
    return parts, last


def plan(spec: dict[str, Any], added_ids: dict[str, int] | None = None, last: dict[str, int] | None = None) -> Plan:
    """Map a parsed ``tokenizer.json`` to tiktoken's ranks and pattern (Refused when it cannot).
    ``added_ids``: the added tokens' ids as the loaded ``tokenizers`` tokenizer has them (it may
    number them otherwise than the file; default: the file's). ``last``: :attr:`Plan.last` as an
    earlier plan of the same file found it (the runs alone are not repeated)."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise Refused(f"model type {model.get('type')!r}, not BPE")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise Refused(f"BPE with {key}={model[key]!r}")
    nfc = _nfc(spec.get("normalizer"))
    pattern = _pattern(spec.get("pre_tokenizer"))
    added = spec.get("added_tokens") or []
    for tok in added:
        for flag in ("lstrip", "rstrip", "single_word"):
            if tok.get(flag):
                raise Refused(f"added token {tok.get('content')!r} with {flag}")
        if tok.get("normalized") and nfc:
            raise Refused(f"added token {tok.get('content')!r} matched after the normalizer")
    if added_ids is None:
        added_ids = {str(t["content"]): int(t["id"]) for t in added if t.get("content")}
    raw = [str(t["content"]) for t in added if t.get("content") and not t.get("normalized")]
    if not added_tokens_agree(raw, [t for t in added_ids if t not in raw]):
        raise Refused("added tokens that one scan may find otherwise than tokenizers' two passes")
    vocab: dict[str, int] = model.get("vocab") or {}
    if len(set(vocab.values())) != len(vocab):
        raise Refused("two vocabulary tokens share an id")
    table = byte_decoder()
    singles = {ch: vocab.get(ch) for ch in table}
    if any(i is None for i in singles.values()):
        raise Refused("the vocabulary lacks a single byte")
    priority: dict[tuple[str, str], int] = {}
    rank: dict[str, int] = {}  # token -> the priority of its first merge, then of its last alone
    for k, (a, b) in enumerate(_merge_pairs(model.get("merges") or [])):
        t = a + b
        if a not in vocab or b not in vocab or t not in vocab:
            raise Refused(f"merge {a!r} {b!r} of tokens outside the vocabulary")
        if (a, b) in priority:
            raise Refused(f"merge {a!r} {b!r} listed twice")  # (a)
        priority[a, b] = k
        rank.setdefault(t, k)
    ignore_merges = bool(model.get("ignore_merges"))
    if last is None:
        last = {}
        for t, first in rank.items():
            pieces, final = alone(t, priority)
            if pieces != [t] or final != first:
                last[t] = final if pieces == [t] else -1
    merged: dict[str, list[int]] = {t: [vocab[t]] for t in rank}
    whole_only: list[str] = []  # ranked for whole words only: their runs alone end in 3+ pieces
    for t, final in last.items():
        if t not in rank:
            raise Refused(f"a cached verdict names {t!r}, which no merge makes")
        if final >= 0:
            rank[t] = final
            continue
        pieces = alone(t, priority)[0]
        if len(pieces) < 3:
            raise Refused(f"token {t!r} does not BPE-encode to itself alone ({pieces})")  # (a)
        del rank[t]
        if ignore_merges:
            whole_only.append(t)
            merged[t] = [vocab[p] for p in pieces]
        else:
            del merged[t]
    order = sorted(rank, key=rank.__getitem__) + sorted(whole_only, key=vocab.__getitem__)
    for token in vocab:
        if (
            len(token) > 1
            and token not in merged
            and token not in added_ids
            and ignore_merges
        ):
            raise Refused(f"token {token!r} has no merge and ignore_merges is on")
    try:
        as_bytes = {t: bytes(table[c] for c in t) for t in order}
    except KeyError:
        raise Refused("a merged token outside the byte-level alphabet") from None
    ids = [vocab[t] for t in order]
    if all(x < y for x, y in itertools.pairwise(ids)):
        # Model ids already follow merge priority: use them as tiktoken ids (a single byte's rank
        # only needs to be unique, merges compare ranks of two-piece concatenations).
        ranks = {bytes([table[ch]]): int(i) for ch, i in singles.items() if i is not None}
        ranks.update({as_bytes[t]: vocab[t] for t in order})
        specials = dict(added_ids)
        return Plan(pattern, nfc, ranks, specials, None, merged, last)
    ranks = {bytes([byte]): byte for byte in range(256)}
    ranks.update({as_bytes[t]: 256 + k for k, t in enumerate(order)})
    to_model = [0] * (256 + len(order))
    for ch, byte in table.items():
        to_model[byte] = int(vocab[ch])
    for k, t in enumerate(order):
        to_model[256 + k] = vocab[t]
    specials = {}
    for content, model_id in added_ids.items():
        specials[content] = len(to_model)
        to_model.append(model_id)
    return Plan(pattern, nfc, ranks, specials, to_model, merged, last)


def verify_merges(spec: dict[str, Any], merged: dict[str, list[int]]) -> None:
    """(b): every ranked multi-byte token, BPE-encoded alone by ``tokenizers`` with merges only,
    gives the pieces the plan expects (itself, but for the tokens ranked for whole words only);
    Refused naming the first that does not."""
    from tokenizers import Tokenizer

    model = dict(spec["model"], ignore_merges=False, dropout=None)
    bare: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        # One encode call for all of them: "\n" is not a byte-level character.
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"String": "\n"},
            "behavior": "Removed",
            "invert": False,
        },
        "post_processor": None,
        "decoder": None,
        "model": model,
    }
    tok = Tokenizer.from_str(json.dumps(bare))
    words = list(merged)
    got = tok.encode("\n".join(words), add_special_tokens=False).ids
    if got == [i for w in words for i in merged[w]]:
        return
    for w in words:  # which one (rare: only on refusal)
        ids = tok.encode(w, add_special_tokens=False).ids
        if ids != merged[w]:
            what = "itself" if len(merged[w]) == 1 else f"the pieces {merged[w]}"
            raise Refused(f"token {w!r} does not BPE-encode to {what} alone ({ids})")
    raise Refused("the merged tokens do not BPE-encode to themselves")


def _probe_texts(added: list[str]) -> list[str]:
    """Hard text for the differential probe: the regex engines' and normalizers' corner cases."""
    spaces = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
    lines = [
        spaces,
        *(f"a{s}b {s}{s}c{s}" for s in spaces),
        *(f"x{s}\n" for s in spaces),
        "\r\n\r\n  x\r\n",
        "  \n\n\t\tfoo  \n",
        "trailing   ",
        "   leading",
        "a  \n  b",
        "\n\n\n",
        " \u00a0 \u00a0x",
        "0123456789 12345678901234567890 3.14159 1,000,000 -42 +7e-3",
        "١٢٣٤٥٦٧٨٩٠ ०१२३४५ ১২৩ ๑๒๓ １２３ ²³¹ ¼½ Ⅻⅻ ① 〇一二三 𝟙𝟚𝟛",
        "日本語のテキスト、句読点。 中文文本，标点。 한국어 텍스트 カタカナ・ひらがな゛゜ゝ abc日本123語",
        "👨\u200d👩\u200d👧\u200d👦 👍🏽 🇫🇷🇩🇪 ❤️ a\u200db \u200b\ufeff \u2060x \U0001f600\U0001f64f",
        "e\u0301 \u0301alone a\u0308\u0301 ñ Ω ﬁ ǅemal ǈ ᾼ ß İstanbul ı \u1100\u1161\u11a8 ẞ",
        "I'm I'M don't DON'T we'Ve it's 's 'S 'T 're 'RE rock'n'roll it’s it'ſ 'ſ 'K 'ǅ ''s '",
        "def f(x):\n    return x**2  # ok\n\t{\"a\": [1, 2.5e3, null]}\n<tag attr='v'>C++ --flag=value",
        "\x00\x01\x07\x7f\x1b[31mred\x1b[0m \ufffd \U0010fffd \ue000",
        "שלום עולם مرحبا بالعالم Ελληνικά Кириллица ქართული हिन्दी தமிழ் ไทย",
        "!!! ??? ... --- ___ *** ### $$$ %%% ^^^ &&& ||| ~~~ ``` ''' \"\"\" <<< >>> ((( ))) [[[ ]]] {{{ }}}",
        "a.b,c;d:e!f?g(h)i[j]k{l}m<n>o/p\\q|r`s~t@u#v$w%x^y&z*",
    ]
    for t in added[:64]:
        lines += [f"x{t}y", f"\n{t}\n", f" {t} ", f"{t}{t}", f"1{t}2", f"日{t}\u0301"]
    # A sweep of the Basic Multilingual Plane in short lines, each code point after a space and
    # between a letter and a digit (less the surrogates, the private use area and the bulk of the
    # CJK ideographs, all letters; their newest additions are in).
    for start in range(0x20, 0x10000, 256):
        if 0x3400 <= start < 0x9F00 or 0xD800 <= start < 0xF900:
            continue
        lines.append(
            "".join(
                f" {c}a{c}1"
                for c in map(chr, range(start, start + 256))
                if not 0xD800 <= ord(c) < 0xF900
            )
        )
    return lines


@dataclass(slots=True)
class FastEncoder:
    """Encodes template text (added tokens recognised) with tiktoken; see the module docstring."""

    encoding: tiktoken.Encoding
    to_model: list[int] | None = field(repr=False)
    nfc: bool
    #: Added token -> its tiktoken id.
    added: dict[str, int] = field(repr=False)
    #: Encodes the guard refused (the caller used ``tokenizers``).
    refused: int = 0
    #: Finds the added tokens, leftmost-longest (:func:`literals_pattern`).
    _added_re: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._added_re = re.compile(literals_pattern(self.added))

    def encode(self, text: str) -> list[int] | None:
        """``text``'s model ids, or None when this encoder cannot vouch for them (text between
        added tokens not NFC under an NFC normalizer; text the pre-tokenizer regex left
        unmatched; lone surrogates): the caller encodes with ``tokenizers`` then."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            self.refused += 1
            return None
        ordinary = self.encoding.encode_ordinary
        nfc = self.nfc and not text.isascii()
        ids: list[int] = []
        pos = 0
        # The added tokens split here, not by tiktoken: its special-token scan is leftmost-first
        # and, with a thousand of them (DeepSeek), slower than the whole rest of the encode.
        for match in self._added_re.finditer(text):
            start = match.start()
            if start > pos:
                piece = text[pos:start]
                if nfc and not unicodedata.is_normalized("NFC", piece):
                    self.refused += 1
                    return None
                ids += ordinary(piece)
            ids.append(self.added[match.group()])
            pos = match.end()
        if pos < len(text):
            piece = text[pos:]
            if nfc and not unicodedata.is_normalized("NFC", piece):
                self.refused += 1
                return None
            ids += ordinary(piece)
        if self.encoding.decode_bytes(ids) != data:
            self.refused += 1
            return None
        if self.to_model is not None:
            table = self.to_model
            return [table[i] for i in ids]
        return ids


def _cache_root() -> Path:
    env = os.environ.get("RESPONSES_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "responses-cache"


@functools.cache
def _checks_digest() -> str:
    """The checks' own code (this module's source), part of a cached verdict's key: a verdict is
    reused only by the code that reached it, so an edited check -- or a bug planted to see a test
    fail -- checks again instead of reading a verdict another version wrote."""
    try:
        return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    except OSError:  # no source to read (a frozen install): the distribution's version
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("responses-cache")
        except PackageNotFoundError:
            return "unknown"


def _verdict_key(tokenizer_json: str) -> str:
    import tokenizers

    h = hashlib.sha256(tokenizer_json.encode("utf-8", "surrogatepass"))
    h.update(f"\x00{_checks_digest()}\x00{tokenizers.__version__}\x00{tiktoken.__version__}".encode())
    return h.hexdigest()


#: The verified encoders built in this process, by verdict key: a second renderer of the same
#: tokenizer (a route's and a backend's tokenizer check, or several routes) takes the first one's
#: tiktoken encoding (immutable, thread-safe) instead of building it again (a second or more for a
#: large vocabulary). A few: each holds its vocabulary's ranks.
_verified_encoders: LRUCache[str, FastEncoder] = LRUCache(maxsize=4)


def fast_encoder(
    tokenizer_json: str,
    tokenizer: Tokenizer,
    *,
    cache_dir: Path | bool | None = True,
) -> FastEncoder | Refused:
    """A verified :class:`FastEncoder` for ``tokenizer_json`` (whose ``tokenizers`` tokenizer,
    added tokens recognised, is ``tokenizer``), or the :class:`Refused` saying why not.

    ``cache_dir``: where the verdict of (b) and the probe is kept (``True``: ``$RESPONSES_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/responses-cache``, else ``~/.cache/responses-cache``, under
    ``hf-tiktoken/``; ``None``/``False``: not cached, checked every time). While a cached verdict
    stands, an encoder already built for it in this process lends its encoding."""
    key = _verdict_key(tokenizer_json)
    root = _cache_root() if cache_dir is True else (cache_dir or None)
    path = root / "hf-tiktoken" / f"{key}.json" if isinstance(root, Path) else None
    cached: Any = None
    if path is not None:
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = None
        if isinstance(cached, dict) and "refused" in cached:
            return Refused(str(cached["refused"]))
    verified = isinstance(cached, dict) and cached.get("verified") is True and isinstance(cached.get("last"), dict)
    known = _verified_encoders.get(key) if verified else None
    if known is not None:  # built in this process under the same verdict: its encoding, a fresh counter
        return FastEncoder(known.encoding, known.to_model, known.nfc, known.added)
    try:
        spec = json.loads(tokenizer_json)
        added_ids = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
        p = plan(spec, added_ids, cached["last"] if verified else None)
        encoding = tiktoken.Encoding(
            f"hf-fast-{hashlib.blake2b(tokenizer_json.encode('utf-8', 'surrogatepass'), digest_size=8).hexdigest()}",
            pat_str=p.pattern,
            mergeable_ranks=p.ranks,
            special_tokens=p.specials,
        )
    except Refused as exc:
        _store(path, exc)
        return exc
    except (ValueError, KeyError, TypeError) as exc:  # tiktoken refusing the pattern, odd JSON
        return Refused(f"not mapped: {exc}")
    encoder = FastEncoder(encoding, p.to_model, p.nfc, p.specials)
    if not verified:
        try:
            verify_merges(spec, p.merged)
            _probe(encoder, tokenizer, list(p.specials))
        except Refused as exc:
            _store(path, exc)
            return exc
        _store(path, {"verified": True, "last": p.last})
        encoder.refused = 0
    if path is not None:
        _verified_encoders[key] = encoder
    return encoder


def _store(path: Path | None, verdict: dict[str, Any] | Refused) -> None:
    """Keep ``verdict`` at ``path`` (a refusal as its reason)."""
    if path is not None:
        text = json.dumps({"refused": str(verdict)} if isinstance(verdict, Refused) else verdict)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.replace(path)
        except OSError:
            pass  # an unwritable cache only costs the check next time


def _probe(encoder: FastEncoder, tokenizer: Tokenizer, added: list[str]) -> None:
    """The differential probe: on every probe text the fast path takes, the ids are
    ``tokenizers``'; Refused with the first text where they differ."""
    texts = _probe_texts(added)
    expected = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    for text, want in zip(texts, expected, strict=True):
        got = encoder.encode(text)
        if got is not None and got != want.ids:
            raise Refused(f"the pre-tokenizer regex splits {text[:40]!r} differently in tiktoken")
