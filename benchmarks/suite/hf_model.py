"""Give a Hugging Face tokenizer directory tiny random weights, so a real vLLM serves it on CPU.

Run inside the vLLM venv (it has torch and transformers)::

    python hf_model.py MODEL_DIR:Qwen2ForCausalLM [MODEL_DIR:LlamaForCausalLM …]

(several in one run: torch and transformers are imported once). Each ``MODEL_DIR`` already holds ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat
template); this writes ``config.json`` and ``model.safetensors`` beside them: two layers, hidden
size 128 (head_dim 64: vLLM's CPU attention refuses smaller heads), a vocabulary covering every id
of the tokenizer, random weights. Its answers are noise; what the engine suite checks with it is
the engine's own tokenizer and chat template (``/tokenize`` with ``messages``). The architecture
only has to be one vLLM serves: ``Qwen2ForCausalLM`` for a Qwen-style model, ``LlamaForCausalLM``
for Llama-3-style and DeepSeek-style ones (DeepSeek's R1 distillations are Llama and Qwen models
with DeepSeek's tokenizer and template).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


def build(out: pathlib.Path, architecture: str, context: int) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    settings = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab = -(-tokenizer.get_vocab_size(with_added_tokens=True) // 64) * 64
    bos, eos = settings.get("bos_token"), settings.get("eos_token")
    kind = {"Qwen2ForCausalLM": "Qwen2Config", "LlamaForCausalLM": "LlamaConfig"}[architecture]
    hidden, heads = 128, 2
    config = getattr(transformers, kind)(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=1,
        head_dim=hidden // heads,
        max_position_embeddings=context,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.token_to_id(bos) if bos else None,
        eos_token_id=tokenizer.token_to_id(eos) if eos else None,
        dtype="bfloat16",
    )
    config.architectures = [architecture]
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("models", nargs="+", help="MODEL_DIR:ARCHITECTURE (Qwen2ForCausalLM or LlamaForCausalLM)")
    parser.add_argument("--context", type=int, default=32768)
    args = parser.parse_args(argv)
    for model in args.models:
        out, architecture = model.rsplit(":", 1)
        build(pathlib.Path(out), architecture, args.context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
