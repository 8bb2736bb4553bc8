"""Vocabularies load offline, from the package or a local directory, and are hash-checked."""

from __future__ import annotations

import gzip
import importlib.resources
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public as openai_public

from responses_cache.tokens import VOCAB_DIR_ENV, VocabularyError, get_renderer, load_encoding
from responses_cache.tokens import vocab as vocab_module

TEXT = "Hello <|end|> wörld 😀\n\n  def f(x):\n\treturn x  # 12345"


def bundled(base: str) -> bytes:
    res = importlib.resources.files("responses_cache").joinpath("vocab").joinpath(f"{base}.tiktoken.gz")
    return gzip.decompress(res.read_bytes())


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt by tiktoken to fetch or read its own cache fails loudly."""

    def boom(*_: Any, **__: Any) -> Any:
        raise AssertionError("tiktoken tried to load a vocabulary itself")

    monkeypatch.setattr(tiktoken.load, "read_file", boom)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", boom)
    monkeypatch.setattr(tiktoken, "get_encoding", boom)


@pytest.mark.parametrize("name", ["o200k_harmony", "o200k_base", "cl100k_base"])
def test_equal_to_tiktoken_constructors(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our regex/special tables equal tiktoken's own (fed the same, verified ranks)."""
    enc = load_encoding(name)

    def ranks(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        assert url.endswith(("/o200k_base.tiktoken", "/cl100k_base.tiktoken"))
        return enc._mergeable_ranks

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", ranks)
    reference = tiktoken.Encoding(**openai_public.ENCODING_CONSTRUCTORS[name]())
    assert enc._pat_str == reference._pat_str
    assert enc._special_tokens == reference._special_tokens
    assert enc.n_vocab == reference.n_vocab
    assert enc.encode(TEXT, disallowed_special=()) == reference.encode(TEXT, disallowed_special=())
    assert enc.encode_ordinary(TEXT) == reference.encode_ordinary(TEXT)


def test_cached_per_process() -> None:
    assert load_encoding("o200k_harmony") is load_encoding("o200k_harmony")
    assert get_renderer("harmony").encoding is get_renderer("harmony").encoding


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_env_var_directory_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None, packed: bool
) -> None:
    data = bundled("cl100k_base")
    if packed:
        (tmp_path / "cl100k_base.tiktoken.gz").write_bytes(gzip.compress(data))
    else:
        (tmp_path / "cl100k_base.tiktoken").write_bytes(data)
    monkeypatch.setenv(VOCAB_DIR_ENV, str(tmp_path))
    enc = load_encoding("cl100k_base")
    assert vocab_module.vocab_source("cl100k_base") == str(
        tmp_path / ("cl100k_base.tiktoken.gz" if packed else "cl100k_base.tiktoken")
    )
    assert enc.decode(enc.encode_ordinary(TEXT)) == TEXT
    assert get_renderer("chatml").count_text(TEXT) == len(enc.encode_ordinary(TEXT))


def test_argument_directory_wins_over_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None) -> None:
    (tmp_path / "o200k_base.tiktoken").write_bytes(bundled("o200k_base"))
    monkeypatch.setenv(VOCAB_DIR_ENV, str(tmp_path / "missing"))
    enc = load_encoding("o200k_harmony", vocab_dir=tmp_path)
    assert enc.encode("<|start|>", allowed_special="all") == [200006]
    r = get_renderer("harmony", vocab_dir=str(tmp_path))
    assert r.encoding is enc


def test_hash_mismatch_is_an_error(tmp_path: Path, no_network: None) -> None:
    data = bytearray(bundled("o200k_base"))
    data[100:104] = b"AAAA"
    (tmp_path / "o200k_base.tiktoken").write_bytes(bytes(data))
    with pytest.raises(VocabularyError, match="fails its hash check"):
        load_encoding("o200k_base", vocab_dir=tmp_path)


def test_missing_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VOCAB_DIR_ENV, str(tmp_path))
    with pytest.raises(VocabularyError, match=r"not found in .*RESPONSES_CACHE_VOCAB_DIR"):
        load_encoding("cl100k_base")


def test_corrupt_gzip_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "cl100k_base.tiktoken.gz").write_bytes(b"not gzip")
    with pytest.raises(VocabularyError, match="cannot read"):
        load_encoding("cl100k_base", vocab_dir=tmp_path)


def test_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown encoding"):
        load_encoding("p50k_base")
    with pytest.raises(ValueError, match="unknown template"):
        get_renderer("llama3")
    with pytest.raises(ValueError, match="o200k_harmony"):
        get_renderer("harmony", encoding="cl100k_base")
    with pytest.raises(ValueError, match="chatml"):
        get_renderer("chatml", encoding="o200k_harmony")


def test_bundled_license_is_shipped() -> None:
    text = importlib.resources.files("responses_cache").joinpath("vocab").joinpath("LICENSE-tiktoken").read_text()
    assert "MIT License" in text and "OpenAI" in text
