"""Build a tiny random-weight Llama that a real vLLM serves on CPU, with no download.

Run inside the vLLM venv (it has torch and transformers), with the repository root on
``PYTHONPATH`` so the bundled offline vocabulary is used::

    python tiny_model.py OUT_DIR [--encoding o200k_harmony] [--chain 173781,200005,17196,200008,13225] [--stop 200002]

The weights are random except for a few designed directions, read straight off the residual
stream (the embedding of the current token reaches the LM head through the final norm):

* every token's embedding carries a constant in dimension 0, from which the LM head reads the
  default next-token distribution: a few thousand ordinary text tokens, one of them (``the``)
  a little likelier than the rest, and the ``--stop`` ids with probability ``--p-stop``;
* ``--chain a,b,c…``: after token ``a`` comes ``b``, after ``b`` comes ``c`` (dimensions 1, 2…),
  so a generation prompt ending in ``a`` is answered in the template's own framing (harmony's
  ``<|channel|>final<|message|>``) and a first word (``Hello``) before the noise.

So with sampling (``temperature`` 1) answers are noise that ends by itself after a few tokens
(``finish_reason: stop``), as a real model's do; greedy (``temperature`` 0) never stops before
``max_tokens`` — what the abort, steering and kill tests need. Everything else, the HTTP API,
token ids, streaming, usage, the prefix cache and aborts, is the real engine's.
"""

from __future__ import annotations

import argparse
import itertools
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
    converter = TikTokenConverter(  # type: ignore[no-untyped-call]
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


def build(out: pathlib.Path, encoding_name: str, stops: list[int], p_stop: float, context: int,
          chain: list[int]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from responses_cache.tokens.vocab import load_encoding

    encoding = load_encoding(encoding_name)
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(encoding, out)
    hidden, heads = 128, 2  # head_dim 64: vLLM's CPU attention refuses smaller heads
    config = LlamaConfig(
        vocab_size=encoding.n_vocab,
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
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    text = _text_tokens(encoding, exclude=set(chain) | set(stops), count=4096)
    likeliest = encoding.encode(" the")[0]
    with torch.no_grad():
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        designed = 1 + len(chain)  # dimension 0, then one per chain link
        embed[:, :designed] = 0.0
        embed[:, 0] = 8.0
        for layer in model.model.layers:  # attention and MLP leave the designed dimensions alone
            layer.self_attn.o_proj.weight[:designed, :] = 0.0
            layer.mlp.down_proj.weight[:designed, :] = 0.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[:designed] = 1.0
        head.zero_()
        # After the norm, h[0] is about sqrt(hidden) (dimension 0 dominates the RMS).
        scale = math.sqrt(hidden)
        head[:, 0] = -100.0 / scale  # everything but the text and stop tokens: never sampled
        head[text, 0] = 0.0
        # p_stop = n_stop * e^s / (n_stop * e^s + n_text)  =>  s = ln(p * n_text / ((1 - p) * n_stop))
        s = math.log(p_stop * len(text) / ((1.0 - p_stop) * len(stops)))
        head[torch.tensor(stops), 0] = s / scale
        head[likeliest, 0] = (s + 0.5) / scale  # greedy decoding picks it forever: no stop
        for link, (current, following) in enumerate(itertools.pairwise(chain), start=1):
            embed[current, link] = 8.0
            head[following, link] = 16.0  # after `current`: a logit of ~+60 (dimension 0 gives ~-70)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    config_path = out / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config["model_max_length"] = context
    config_path.write_text(json.dumps(tok_config))


def _text_tokens(encoding: Any, *, exclude: set[int], count: int) -> list[int]:
    """Ordinary tokens that are printable text on their own (no partial UTF-8)."""
    chosen: list[int] = []
    for token in range(256, encoding.n_vocab):
        if token in exclude or token in encoding._special_tokens.values():
            continue
        try:
            piece = encoding.decode_single_token_bytes(token).decode("utf-8")
        except (UnicodeDecodeError, KeyError):
            continue
        if piece.strip() and piece.isprintable():
            chosen.append(token)
            if len(chosen) == count:
                break
    return chosen


def ids(value: str) -> list[int]:
    return [int(v) for v in value.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--encoding", default="o200k_harmony")
    parser.add_argument("--stop", default="200002", help="comma-separated stop ids")
    parser.add_argument("--chain", default="173781,200005,17196,200008,13225",
                        help="comma-separated ids: after each comes the next (default: harmony's "
                             "'assistant' -> <|channel|> final <|message|> Hello)")
    parser.add_argument("--p-stop", type=float, default=0.15)
    parser.add_argument("--context", type=int, default=4096)
    args = parser.parse_args(argv)
    build(args.out, args.encoding, ids(args.stop), args.p_stop, args.context, ids(args.chain))
    return 0


if __name__ == "__main__":
    sys.exit(main())
