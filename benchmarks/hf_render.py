"""Per-turn cost of the ``hf`` renderer against history length, next to the harmony path and the
engine's own path.

For each model family (the test assets of ``tests/tokens/hf_assets.py``, or ``--model DIR``), an
agent history (user task, then reasoning + shell call + output per step) is grown to ~10k, ~50k
and ~100k tokens; one new turn (the pending call's output, the next reasoning + call) is then timed
three ways:

* ``hf``       -- ``extend`` (render + tokenize the new items) with the model's template and
  tokenizer (this project); ``hf+prompt`` adds materializing the prompt ids (an O(history) copy);
* ``harmony``  -- the same on the harmony renderer, same items;
* ``engine``   -- ``transformers.apply_chat_template(..., tokenize=True)`` of the whole
  conversation, what an engine's chat endpoint (or ``/tokenize`` with ``messages``) does per turn.

    python benchmarks/hf_render.py                       # every test family, 10k/50k/100k
    python benchmarks/hf_render.py --model ~/models/Qwen3-8B --repeat 7
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.render_history import FILLER, INSTRUCTIONS, new_turn_for, step
from responses_cache.protocol.items import Item, Message
from responses_cache.protocol.tools import ToolSet, parse_tools
from responses_cache.tokens import get_renderer
from responses_cache.tokens.hf_messages import chat_messages, chat_tools

TOOLS = parse_tools(
    b'[{"type": "function", "name": "shell", "description": "Run a command.",'
    b' "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]'
)


def history(r: Any, tools: ToolSet, target: int) -> tuple[list[Item], Any]:
    items: list[Item] = [Message(role="user", content="Fix the failing test in tests/test_api.py. " + FILLER)]
    log = r.render_full(INSTRUCTIONS, tools, items)
    k = 0
    while log.num_tokens < target:
        new = step(k)
        log = r.extend(log, new)
        items += new
        k += 1
    new = step(k)[:2]
    return [*items, *new], r.extend(log, new)


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="a model directory (default: the test families)")
    ap.add_argument("--sizes", default="10000,50000,100000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-engine", action="store_true", help="skip the transformers baseline")
    args = ap.parse_args()
    models: dict[str, pathlib.Path] = {}
    if args.model:
        models = {pathlib.Path(m).name: pathlib.Path(m).expanduser() for m in args.model}
    else:
        from tests.tokens.hf_assets import FAMILIES, build_tokenizer_dir

        root = pathlib.Path(tempfile.mkdtemp(prefix="hf-bench-"))
        models = {f: build_tokenizer_dir(f, root / f) for f in FAMILIES}
    harmony = get_renderer("harmony")
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'model':10} {'history':>8} {'hf ms':>8} {'harmony ms':>10} {'hf/harm':>8} "
          f"{'hf+prompt':>10} {'harm+prompt':>11} {'engine ms':>10} {'engine/hf':>9}")
    for name, path in models.items():
        r = get_renderer(f"hf:{path}")
        tokenizer = None
        if not args.no_engine:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(path))
        per_size = []
        for size in sizes:
            items, log = history(r, TOOLS, size)
            turn = new_turn_for(items)
            hf_s = best(lambda r=r, log=log, turn=turn: r.extend(log, turn), args.repeat)
            hf_prompt_s = best(lambda r=r, log=log, turn=turn: r.prompt(r.extend(log, turn)), args.repeat)
            h_items, h_log = history(harmony, TOOLS, size)
            h_turn = new_turn_for(h_items)
            harmony_s = best(lambda h_log=h_log, h_turn=h_turn: harmony.extend(h_log, h_turn), args.repeat)
            harmony_prompt_s = best(lambda h_log=h_log, h_turn=h_turn: harmony.prompt(harmony.extend(h_log, h_turn)), args.repeat)
            engine = ""
            ratio = ""
            if tokenizer is not None:
                messages = chat_messages(INSTRUCTIONS, [*items, *turn])
                tools = chat_tools(TOOLS)
                engine_s = best(
                    lambda messages=messages, tools=tools, tokenizer=tokenizer: tokenizer.apply_chat_template(
                        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
                    ),
                    args.repeat,
                )
                engine, ratio = f"{engine_s * 1e3:10.2f}", f"{engine_s / hf_prompt_s:9.1f}"
            per_size.append(hf_s)
            print(f"{name:10} {log.num_tokens:8d} {hf_s * 1e3:8.2f} {harmony_s * 1e3:10.2f} {hf_s / harmony_s:8.2f} "
                  f"{hf_prompt_s * 1e3:10.2f} {harmony_prompt_s * 1e3:11.2f} {engine:>10} {ratio:>9}")
        print(f"{name:10} flatness (largest / smallest history): {per_size[-1] / per_size[0]:.2f}")


if __name__ == "__main__":
    main()
