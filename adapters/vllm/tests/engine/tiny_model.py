"""Build a tiny random-weight Llama that a real vLLM serves on CPU, with no download.

Run inside the vLLM venv (it has torch and transformers), with the repository root on
``PYTHONPATH`` so the bundled offline vocabulary is used::

    python tiny_model.py OUT_DIR [--encoding o200k_harmony] [--stop 200002,200012]

The weights are random except for one designed direction: every token's embedding carries a
large constant in dimension 0, the final norm keeps only that dimension, and the LM head reads
the next-token distribution off it. So whatever the prompt, the model samples ordinary text
tokens and one of the ``--stop`` ids with probability ``--p-stop`` per step: answers are noise,
but they end by themselves (``finish_reason: stop``) after a few tokens, as a real model's do.
Everything else — the HTTP API, token ids, streaming, usage, the prefix cache, aborts — is the
real engine's.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from typing import Any


def write_tokenizer(encoding: Any, out: pathlib.Path) -> None:
    """``tokenizer.json`` from a tiktoken encoding, with every special token at tiktoken's id.

    transformers' converter numbers the special tokens in the order it is given them, right after
    the BPE ranks; tiktoken's own dict is not in id order (and o200k_harmony names id 200018
    twice), so hand it one name per id, in id order, and check every id afterwards."""
    from tiktoken.load import dump_tiktoken_bpe
    from tokenizers import Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    by_id: dict[int, str] = {}
    for name, token in sorted(encoding._special_tokens.items(), key=lambda kv: (kv[1], "reserved" in kv[0])):
        by_id.setdefault(token, name)
    first = len(encoding._mergeable_ranks)
    if sorted(by_id) != list(range(first, first + len(by_id))):
        raise ValueError(f"{encoding.name}: special tokens are not contiguous after the BPE ranks")
    ranks = out / "tiktoken" / f"{encoding.name}.tiktoken"
    ranks.parent.mkdir(parents=True, exist_ok=True)
    dump_tiktoken_bpe(encoding._mergeable_ranks, str(ranks))
    converter = TikTokenConverter(
        vocab_file=str(ranks), pattern=encoding._pat_str, extra_special_tokens=[by_id[i] for i in sorted(by_id)]
    )
    converter.converted().save(str(out / "tokenizer.json"))
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    wrong = {name: (tokenizer.token_to_id(name), token) for token, name in by_id.items()
             if tokenizer.token_to_id(name) != token}
    probe = "Grüße, 世界 🚀 x=42;\n\t<|start|>"
    if wrong or tokenizer.encode(probe, add_special_tokens=False).ids != encoding.encode(probe, allowed_special="all"):
        raise ValueError(f"the converted tokenizer disagrees with tiktoken (name: (got, want)): {wrong}")
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))


def build(out: pathlib.Path, encoding_name: str, stops: list[int], p_stop: float, context: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from responses_cache.tokens.vocab import load_encoding

    encoding = load_encoding(encoding_name)
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(encoding, out)
    vocab = encoding.n_vocab
    hidden, heads = 128, 2  # head_dim 64: vLLM's CPU attention refuses smaller heads
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=1,
        head_dim=hidden // heads,
        max_position_embeddings=context,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=stops,
        pad_token_id=None,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    specials = set(encoding._special_tokens.values())
    ordinary = [t for t in range(vocab) if t not in specials]
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 8.0
        for layer in model.model.layers:  # keep dimension 0 of the residual stream intact
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        head = model.lm_head.weight
        head.zero_()
        # After the norm, h[0] is about sqrt(hidden); logits are head[:, 0] * h[0].
        scale = math.sqrt(hidden)
        head[:, 0] = -100.0 / scale  # special tokens: never sampled
        text = torch.tensor(ordinary[:4096])  # a few thousand ordinary tokens, equally likely
        head[text, 0] = 0.0
        # p_stop = n_stop * e^s / (n_stop * e^s + n_text)  =>  s = ln(p * n_text / ((1 - p) * n_stop))
        s = math.log(p_stop * len(text) / ((1.0 - p_stop) * len(stops)))
        head[torch.tensor(stops), 0] = s / scale
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    config_path = out / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config["model_max_length"] = context
    config_path.write_text(json.dumps(tok_config, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--encoding", default="o200k_harmony")
    parser.add_argument("--stop", default="200002,200012", help="comma-separated stop ids")
    parser.add_argument("--p-stop", type=float, default=0.15)
    parser.add_argument("--context", type=int, default=4096)
    args = parser.parse_args(argv)
    build(args.out, args.encoding, [int(s) for s in args.stop.split(",")], args.p_stop, args.context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
