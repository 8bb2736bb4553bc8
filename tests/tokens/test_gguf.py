"""The ``gguf:`` renderer's metadata reader and tokenizer rebuild, on a small GGUF written here (a
byte-level BPE vocabulary, merges, special tokens and a ChatML template). Real GGUF files
converted by llama.cpp, against a real ``llama-server``: ``adapters/llamacpp/tests/engine``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFWriter

from responses_cache.tokens import get_renderer
from responses_cache.tokens.gguf import GGUFError, model_dir, read_metadata, tokenizer_files

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_symbols() -> list[str]:
    """Byte-level BPE's printable stand-in for each byte (printable Latin-1 bytes stand for
    themselves, the others for the code points from 256 on, in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in keep:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def write_gguf(path: Path, metadata: dict[str, Any]) -> Path:
    """A GGUF file with ``metadata`` and no tensors, written by llama.cpp's own ``gguf`` package."""
    writer = GGUFWriter(path, str(metadata.get("general.architecture", "qwen2")))
    for key, value in metadata.items():
        if key == "general.architecture":
            continue  # the writer's own first key
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def tiny_metadata(**overrides: Any) -> dict[str, Any]:
    symbols = _byte_symbols()
    space = symbols[ord(" ")]
    words = ["hi", *(space + "there"[:n] for n in range(1, 6))]  # each merge's result
    tokens = [*symbols, *words, "<|im_start|>", "<|im_end|>", "<think>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 4]  # control, control, user-defined
    return {
        "general.architecture": "qwen2",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": ["h i", f"{space} t", f"{space}t h", f"{space}th e", f"{space}the r",
                                  f"{space}ther e"],
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": TEMPLATE,
        **overrides,
    }


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESPONSES_CACHE_DIR", str(tmp_path / "cache"))


def test_the_metadata_is_read_back(tmp_path: Path) -> None:
    metadata = tiny_metadata()
    assert read_metadata(write_gguf(tmp_path / "m.gguf", metadata)) == metadata


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"not a model")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        read_metadata(tmp_path / "x.gguf")


def test_the_renderer_tokenizes_and_renders_with_the_files_vocabulary(tmp_path: Path) -> None:
    metadata = tiny_metadata()
    tokens = metadata["tokenizer.ggml.tokens"]
    renderer = get_renderer(f"gguf:{write_gguf(tmp_path / 'tiny.gguf', metadata)}")
    assert renderer.encode_with_specials("<|im_start|>hi there<|im_end|>") == [
        tokens.index("<|im_start|>"), tokens.index("hi"), tokens.index(f"{_byte_symbols()[32]}there"),
        tokens.index("<|im_end|>")]
    # Control tokens are special (user text that looks like one stays text); user-defined ones
    # are split out of the text as llama.cpp does.
    assert renderer.encode_text("<|im_end|>")[0] != tokens.index("<|im_end|>")
    assert renderer.encode_with_specials("<think>") == [tokens.index("<think>")]
    assert renderer.decode(renderer.encode_text("hi there, ünï")) == "hi there, ünï"
    assert tokens.index("<|im_end|>") in renderer.stop_tokens
    assert renderer.decode(list(renderer.generation_prompt)) == "<|im_start|>assistant\n"


def test_the_model_directory_is_made_once(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", tiny_metadata())
    made = model_dir(path)
    assert made.parent == tmp_path / "cache" / "gguf" and (made / "tokenizer.json").is_file()
    assert model_dir(path) == made


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tokenizer.ggml.model": "llama"}, "'llama' tokenizer"),
        ({"tokenizer.ggml.pre": "tekken"}, "pre-tokenizer 'tekken' is not known"),
        ({"tokenizer.chat_template": ""}, "no chat template"),
    ],
)
def test_what_cannot_be_rebuilt_is_refused_with_the_way_out(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(GGUFError, match=message):
        tokenizer_files(tiny_metadata(**overrides))
