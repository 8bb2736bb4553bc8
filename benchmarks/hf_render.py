"""Per-turn cost of the ``hf`` renderer against history length, side by side with the harmony path
and the engine's own path.

For each model family (the test assets of ``tests/tokens/hf_assets.py``, or ``--model DIR``), an
agent history (user task, then reasoning + shell call + output per step) is grown to ~10k, ~50k
and ~100k tokens; then ``--turns`` consecutive turns (the pending call's output, the next
reasoning + call) are timed, each on the log the previous one returned, and reported per turn:

* ``hf``       -- ``extend`` (render + tokenize the new items) with the model's template and
  tokenizer (this project);
* ``hf-tok``   -- the same with the verified tiktoken path off (``fast_encode=False``: every text
  encoded by the ``tokenizers`` library), on the same logs;
* ``harmony``  -- the same on the harmony renderer, same items;
* ``encode``   -- the floor under ``hf``: the renderer's encoder (the verified tiktoken path where
  it holds) encoding just the text each turn added (what any exact renderer must tokenize), no
  template;
* ``no-tpl``   -- ``hf`` with the template's runs replayed (their texts recorded on the same turns
  once, then handed back in order, :class:`Replayed`): what the turn would cost with a template
  engine that took no time -- encoding plus the renderer's own bookkeeping (the window's chat
  messages, the certificate, the generation prompt, the log's nodes);
* ``floor``    -- ``encode`` plus one run of the template over the head (instructions, tools, the
  user task) and the turn's new items alone: the least any renderer that runs the model's
  template per turn must spend, before any bookkeeping (what a window of no old items would cost,
  without the certificate that makes its output the template's);
* ``engine``   -- ``transformers.apply_chat_template(..., tokenize=True)`` of the whole
  conversation, what an engine's chat endpoint (or ``/tokenize`` with ``messages``) does per turn;
  ``engine / hf`` compares it with ``extend`` + ``prompt`` (materializing the prompt ids).

Our paths are timed interleaved (hf, harmony, encode, hf-tok, then again), and so are the
history sizes of a model (the engine's path, hundreds of times slower, is timed after them): all its histories are built first, then each of the ``--repeat``
rounds times every size, in a random order (``--seed``), so that the flatness figure (largest over
smallest history) compares turns timed at the same moments, not minutes apart; medians; CPU time
of this process (``time.process_time``), so that time the process spends waiting for a core on a
shared machine is not counted.

    python -m benchmarks.hf_render --repeat 7            # every test family, 10k/50k/100k
    python -m benchmarks.hf_render --model ~/models/Qwen3-8B --repeat 7
    RESPONSES_CACHE_HF_FAST=0 python -m benchmarks.hf_render   # hf and encode on tokenizers too
"""

from __future__ import annotations

import argparse
import pathlib
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.render_history import FILLER, INSTRUCTIONS, new_turn_for, step
from responses_cache.protocol.items import FunctionCall, Item, Message
from responses_cache.protocol.tools import ToolSet, parse_tools
from responses_cache.tokens import get_renderer, hf_log
from responses_cache.tokens.hf import HFRenderer
from responses_cache.tokens.hf_messages import chat_messages, chat_tools
from responses_cache.tokens.log import TokenLog

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


def turns_after(items: list[Item], n: int) -> list[list[Item]]:
    """``n`` consecutive turns after ``items``: output of the pending call, next reasoning + call."""
    out: list[list[Item]] = []
    grown = list(items)
    for _ in range(n):
        turn = new_turn_for(grown)
        out.append(turn)
        grown += turn
    return out


def run_turns(r: Any, log: TokenLog, turns: list[list[Item]], prompt: bool = False) -> TokenLog:
    for turn in turns:
        log = r.extend(log, turn)
        if prompt:
            r.prompt(log)
    return log


def added_texts(r: Any, log: TokenLog, n: int) -> list[str]:
    """The text each of the last ``n`` turns of an ``hf`` log added (its first node holds it)."""
    texts: list[str] = []
    node = log._node
    while len(texts) < n and node is not None:
        text = hf_log.piece(node).text
        if text:
            texts.append(text)
        node = node.parent
    return texts[::-1]


class Replayed:
    """Stands in for a renderer's compiled template: hands back, in order, the texts the real one
    gave for the same sequence of runs (recorded by :meth:`record`)."""

    def __init__(self, template: Any) -> None:
        self.template, self.at = template, 0
        self.outputs: list[Any] = []

    def record(self, run: Callable[[], object]) -> None:
        def recording(name: str) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                out = getattr(self.template, name)(*args, **kwargs)
                self.outputs.append(out)
                return out
            return call

        self.render, self.text, self.render_pair = recording("render"), recording("text"), recording("render_pair")
        run()
        self.render = self.text = self.render_pair = self._next

    def _next(self, *args: Any, **kwargs: Any) -> Any:
        out = self.outputs[self.at % len(self.outputs)]
        self.at += 1
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.template, name)


def cpu(fn: Callable[[], object]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def one_round(
    r: Any,
    log: TokenLog,
    turns: list[list[Item]],
    harmony: Any,
    h_log: TokenLog,
    h_turns: list[list[Item]],
    texts: list[str],
    slow: Any,
    replay: Any,
    least: list[dict[str, Any]],
) -> dict[str, float]:
    """CPU seconds per turn of each of our paths, once, one after the other."""
    n = len(turns)
    return {
        "no-tpl": cpu(lambda: run_turns(replay, log, turns)) / n,
        "hf": cpu(lambda: run_turns(r, log, turns)) / n,
        "harmony": cpu(lambda: run_turns(harmony, h_log, h_turns)) / n,
        "encode": cpu(lambda: [r._encoder.encode(t) for t in texts]) / n,
        "least": cpu(lambda: [r._runner.template.render_pair(v) for v in least]) / n,
        "hf-tok": cpu(lambda: run_turns(slow, log, turns)) / n,
        "hf+p": cpu(lambda: run_turns(r, log, turns, prompt=True)) / n,
        "harmony+p": cpu(lambda: run_turns(harmony, h_log, h_turns, prompt=True)) / n,
    }


def engine_path(tokenizer: Any, messages: list[dict[str, Any]]) -> float:
    """CPU seconds of the engine's own path: the whole conversation through the template and the
    tokenizer (timed apart from the rounds above: its allocations, hundreds of times larger,
    would disturb the per-turn figures they sit between)."""
    tools = chat_tools(TOOLS)
    return cpu(lambda: tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False))


@dataclass
class Case:
    """One history size of one model: its logs, the turns timed after them, and the texts they add."""

    log: TokenLog
    turns: list[list[Item]]
    h_log: TokenLog
    h_turns: list[list[Item]]
    texts: list[str]
    messages: list[dict[str, Any]]
    runs: float
    replay: Any
    #: Per turn, the template's variables for the head and that turn's items alone.
    least: list[dict[str, Any]]
    rounds: dict[str, list[float]] = field(default_factory=dict)

    def median_ms(self) -> dict[str, float]:
        return {k: statistics.median(v) * 1e3 for k, v in self.rounds.items()}


def replayed(path: pathlib.Path, window: int | None, log: TokenLog, turns: list[list[Item]]) -> HFRenderer:
    """A renderer like ``r`` whose template replays what it rendered for ``turns`` after ``log``."""
    rp = HFRenderer(str(path), window=window)
    template = Replayed(rp._runner.template)
    rp._runner.template = template  # type: ignore[assignment]
    template.record(lambda: run_turns(rp, log, turns))
    return rp


def prepare(r: Any, harmony: Any, size: int, n: int, path: pathlib.Path) -> Case:
    items, log = history(r, TOOLS, size)
    turns = turns_after(items, n)
    h_items, h_log = history(harmony, TOOLS, size)
    texts = added_texts(r, run_turns(r, log, turns), n)
    runs0 = r.stats.template_runs
    run_turns(r, log, turns)
    runs = (r.stats.template_runs - runs0) / n
    every = [*items, *(i for t in turns for i in t)]
    messages = chat_messages(INSTRUCTIONS, every)
    names = {i.call_id: i.name for i in every if isinstance(i, FunctionCall)}
    tools = chat_tools(TOOLS)
    least = [r._runner.variables(chat_messages(INSTRUCTIONS, [items[0], *turn], calls=names.get), tools) for turn in turns]
    return Case(log, turns, h_log, turns_after(h_items, n), texts, messages, runs, replayed(path, r.window, log, turns), least)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="a model directory (default: the test families)")
    ap.add_argument("--sizes", default="10000,50000,100000")
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds per cell (median)")
    ap.add_argument("--turns", type=int, default=24, help="consecutive turns per round")
    ap.add_argument("--window", type=int, default=8, help="the hf renderer's window (0: none)")
    ap.add_argument("--no-engine", action="store_true", help="skip the transformers baseline")
    ap.add_argument("--seed", type=int, default=0, help="the order of the sizes in each round")
    args = ap.parse_args()
    models: dict[str, pathlib.Path] = {}
    if args.model:
        models = {pathlib.Path(m).name: pathlib.Path(m).expanduser() for m in args.model}
    else:
        from tests.tokens.hf_assets import FAMILIES, available, build_tokenizer_dir

        root = pathlib.Path(tempfile.mkdtemp(prefix="hf-bench-"))
        models = {f: build_tokenizer_dir(f, root / f) for f in FAMILIES if available(f)}
    harmony = get_renderer("harmony")
    sizes = [int(s) for s in args.sizes.split(",")]
    order = random.Random(args.seed)
    n = args.turns
    print(f"per turn, median of {args.repeat} rounds of {n} consecutive turns, CPU ms; the sizes of a model interleaved\n")
    print(f"{'model':11} {'history':>8} {'hf':>6} {'harmony':>7} {'hf/harm':>7} {'encode':>6} {'enc/harm':>8} {'no-tpl/harm':>11} {'floor/harm':>10} "
          f"{'hf-tok':>6} {'tok/harm':>8} {'hf+prompt':>9} {'harm+prompt':>11} {'engine':>8} {'engine/hf':>9} {'runs/turn':>9}")
    for name, path in models.items():
        r = get_renderer(f"hf:{path}", window=args.window or None)
        slow = get_renderer(f"hf:{path}", window=args.window or None, fast_encode=False)
        tokenizer = None
        if not args.no_engine:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(path))
        cases = {size: prepare(r, harmony, size, n, path) for size in sizes}
        for _ in range(args.repeat):  # every size in each round, in a random order: the box's drift hits all alike
            for size in order.sample(sizes, len(sizes)):
                case = cases[size]
                cells = one_round(r, case.log, case.turns, harmony, case.h_log, case.h_turns, case.texts, slow, case.replay, case.least)
                for key, value in cells.items():
                    case.rounds.setdefault(key, []).append(value)
        if tokenizer is not None:
            for case in cases.values():
                case.rounds["engine"] = [engine_path(tokenizer, case.messages) for _ in range(args.repeat)]
        for case in cases.values():
            med = case.median_ms()
            engine = f"{med['engine']:8.2f}" if tokenizer is not None else ""
            ratio = f"{med['engine'] / med['hf+p']:8.0f}x" if tokenizer is not None else ""
            print(f"{name:11} {case.log.num_tokens:8d} {med['hf']:6.3f} {med['harmony']:7.3f} {med['hf'] / med['harmony']:6.1f}x "
                  f"{med['encode']:6.3f} {med['encode'] / med['harmony']:7.1f}x {med['no-tpl'] / med['harmony']:10.2f}x {(med['encode'] + med['least']) / med['harmony']:9.2f}x "
                  f"{med['hf-tok']:6.3f} {med['hf-tok'] / med['harmony']:7.1f}x {med['hf+p']:9.3f} {med['harmony+p']:11.3f} "
                  f"{engine:>8} {ratio:>9} {case.runs:9.2f}")
        small, large = cases[sizes[0]].median_ms(), cases[sizes[-1]].median_ms()
        print(f"{name:11} flatness (largest / smallest history): hf {large['hf'] / small['hf']:.2f}, "
              f"harmony {large['harmony'] / small['harmony']:.2f}")


if __name__ == "__main__":
    main()
