"""Give a Hugging Face tokenizer directory tiny random weights, so a real vLLM serves it on CPU.

Run inside the vLLM venv (it has torch and transformers)::

    python hf_model.py MODEL_DIR:Qwen2ForCausalLM [MODEL_DIR:LlamaForCausalLM …] [--shape qwen3-0.6b]

(several in one run: torch and transformers are imported once). Each ``MODEL_DIR`` already holds ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat
template); this writes ``config.json`` and ``model.safetensors`` beside them: two layers, hidden
size 128 (head_dim 64: vLLM's CPU attention refuses smaller heads), a vocabulary covering every id
of the tokenizer, random weights. Its answers are noise; what the engine suite checks with it is
the engine's own tokenizer and chat template (``/tokenize`` with ``messages``). The architecture
only has to be one vLLM serves: ``Qwen2ForCausalLM`` for a Qwen-style model, ``LlamaForCausalLM``
for Llama-3-style and DeepSeek-style ones (DeepSeek's R1 distillations are Llama and Qwen models
with DeepSeek's tokenizer and template).

``--shape qwen3-0.6b`` gives the model the size and shape of Qwen3-0.6B instead (28 layers, hidden
size 1,024, 16 query and 8 key/value heads of 128, tied embeddings; about 0.6 billion random
weights, built on the GPU where there is one): what a GPU engine runs at a real model's speed
(``benchmarks/gpu/llama_cuda.sh``), with no download of weights.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

#: The models' sizes: ``tiny`` (what a CPU engine serves in the suite) and a real model's.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 64, "tie_word_embeddings": False},
    "qwen3-0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True},
}


def build(out: pathlib.Path, architecture: str, context: int, shape: str = "tiny") -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    settings = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab = -(-tokenizer.get_vocab_size(with_added_tokens=True) // 64) * 64
    bos, eos = settings.get("bos_token"), settings.get("eos_token")
    kind = {"Qwen2ForCausalLM": "Qwen2Config", "Qwen3ForCausalLM": "Qwen3Config", "LlamaForCausalLM": "LlamaConfig"}
    config = getattr(transformers, kind[architecture])(
        vocab_size=vocab,
        max_position_embeddings=context,
        bos_token_id=tokenizer.token_to_id(bos) if bos else None,
        eos_token_id=tokenizer.token_to_id(eos) if eos else None,
        dtype="bfloat16",
        **SHAPES[shape],
    )
    config.architectures = [architecture]
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = getattr(transformers, architecture)(config)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("models", nargs="+", help="MODEL_DIR:ARCHITECTURE (Qwen2ForCausalLM or LlamaForCausalLM)")
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    args = parser.parse_args(argv)
    for model in args.models:
        out, architecture = model.rsplit(":", 1)
        build(pathlib.Path(out), architecture, args.context, args.shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
