"""Per-turn render time against history length: incremental ``extend`` vs full ``render_full``.

Builds a Codex-like agent history (user task, then reasoning + tool call + tool output per step)
of 1k, 2k, ... 128k tokens, then times one new turn (a tool output plus the next
reasoning + call, ~600 tokens) both ways, side by side in one run:

* ``extend``      — append the new items to the cached log (what the WebSocket path does);
* ``full``        — render the whole conversation from scratch (what a stateless server does);
* ``prompt``      — materialize the prompt ids (log + generation prompt) as one ``array('I')``;
* ``prefix``      — ``child.common_prefix(parent)`` (the reused, ``cached_tokens`` prefix);
* ``final``       — extend with a final answer instead (harmony then hides every earlier analysis
  message: a history rewrite, relinked without re-encoding);
* ``harmony``     — (``--oracle``) openai-harmony's ``render_conversation_for_completion`` of the
  whole conversation, what a stateless gpt-oss server runs per request.

    python benchmarks/render_history.py                 # harmony, 1k..128k
    python benchmarks/render_history.py --oracle        # + openai-harmony's own full render
    python benchmarks/render_history.py --template chatml --encoding cl100k_base
    python benchmarks/render_history.py --max-tokens 32768 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
    Reasoning,
    ReasoningText,
)
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.tokens import BaseRenderer, get_renderer

INSTRUCTIONS = "You are a coding agent. Run tools to inspect and fix the repository."
FILLER = (
    "def handler(request):\n    payload = json.loads(request.body)\n    if not payload.get('id'):\n"
    "        raise ValueError('missing id')  # see issue #1234\n    return Response(status=200)\n"
)


def step(k: int) -> list[Item]:
    """One agent step: reasoning, a shell call and its (file-listing-like) output."""
    return [
        Reasoning(summary=[], content=[ReasoningText(f"Step {k}: inspect module_{k}.py next.")]),
        FunctionCall(call_id=f"call{k:05d}", name="shell", arguments=f'{{"cmd": "cat src/module_{k}.py"}}'),
        FunctionCallOutput(call_id=f"call{k:05d}", output=f"# module_{k}.py\n" + FILLER * 3),
    ]


def history_of(r: BaseRenderer, target_tokens: int) -> list[Item]:
    """An agent rollout of at least ``target_tokens``, ending in a call that awaits its output."""
    items: list[Item] = [Message(role="user", content="Fix the failing test in tests/test_api.py.")]
    log = r.render_full(INSTRUCTIONS, EMPTY_TOOLS, items)
    k = 0
    while True:
        new = step(k)[:2]  # reasoning + call
        log = r.extend(log, new)
        items += new
        if log.num_tokens >= target_tokens:
            return items
        output = step(k)[2]
        log = r.extend(log, [output])
        items.append(output)
        k += 1


def new_turn_for(history: Sequence[Item]) -> list[Item]:
    """The next turn: the pending call's output, then the model's next reasoning + call."""
    last = history[-1]
    assert isinstance(last, FunctionCall)
    k = int(last.call_id.removeprefix("call")) + 1
    return [FunctionCallOutput(call_id=last.call_id, output=FILLER * 8), *step(k)[:2]]


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def harmony_oracle() -> Callable[[Sequence[Item]], list[int]]:
    """openai-harmony's full render of the same conversation (what a stateless server runs)."""
    import gzip
    import importlib.resources
    import os
    import tempfile

    import openai_harmony as h

    directory = tempfile.mkdtemp(prefix="harmony-vocab-")
    packed = importlib.resources.files("responses_cache").joinpath("vocab").joinpath("o200k_base.tiktoken.gz")
    with open(os.path.join(directory, "o200k_base.tiktoken"), "wb") as f:
        f.write(gzip.decompress(packed.read_bytes()))
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = directory
    enc = h.load_harmony_encoding(h.HarmonyEncodingName.HARMONY_GPT_OSS)
    system = h.Message.from_role_and_content(h.Role.SYSTEM, h.SystemContent.new())
    developer = h.Message.from_role_and_content(h.Role.DEVELOPER, h.DeveloperContent.new().with_instructions(INSTRUCTIONS))

    def render(items: Sequence[Item]) -> list[int]:
        msgs = [system, developer]
        for item in items:
            if isinstance(item, Message):
                msgs.append(h.Message.from_role_and_content(h.Role(item.role), str(item.content)))
            elif isinstance(item, Reasoning):
                msgs.append(h.Message.from_role_and_content(h.Role.ASSISTANT, item.content[0].text if item.content else "").with_channel("analysis"))
            elif isinstance(item, FunctionCall):
                msgs.append(
                    h.Message.from_role_and_content(h.Role.ASSISTANT, item.arguments)
                    .with_channel("commentary").with_recipient(f"functions.{item.name}").with_content_type("<|constrain|>json")
                )
            elif isinstance(item, FunctionCallOutput):
                author = h.Author.new(h.Role.TOOL, "functions.shell")
                msgs.append(h.Message(author=author, content=[h.TextContent(text=str(item.output))]).with_channel("commentary").with_recipient("assistant"))
        return list(enc.render_conversation_for_completion(h.Conversation.from_messages(msgs), h.Role.ASSISTANT))

    return render


def run(
    template: str, encoding: str | None, sizes: Sequence[int], repeat: int, with_oracle: bool = False
) -> list[dict[str, float]]:
    r = get_renderer(template, encoding=encoding)
    oracle = harmony_oracle() if with_oracle and template == "harmony" else None
    rows = []
    for size in sizes:
        history = history_of(r, size)
        new_turn = new_turn_for(history)
        parent = r.render_full(INSTRUCTIONS, EMPTY_TOOLS, history)
        child = r.extend(parent, new_turn)
        assert child.tokens() == r.render_full(INSTRUCTIONS, EMPTY_TOOLS, history + new_turn).tokens()
        if oracle:
            assert oracle(history + new_turn) == list(r.prompt(child))
        before = r.stats.tokens_encoded
        t_extend = timed(lambda parent=parent, new_turn=new_turn: r.extend(parent, new_turn), repeat)
        per_turn_tokens = (r.stats.tokens_encoded - before) / repeat
        t_full = timed(
            lambda history=history, new_turn=new_turn: r.render_full(INSTRUCTIONS, EMPTY_TOOLS, history + new_turn),
            repeat,
        )
        t_prompt = timed(lambda child=child: r.prompt(child), repeat)
        t_prefix = timed(lambda child=child, parent=parent: child.common_prefix(parent), repeat)
        # a final answer: harmony hides every earlier analysis message (a history rewrite)
        final = [Message(role="assistant", content="Fixed: the handler now validates ids.")]
        t_final = timed(lambda child=child, final=final: r.extend(child, final), repeat)
        t_oracle = timed(lambda h=history + new_turn: oracle(h), repeat) if oracle else float("nan")
        rows.append(
            {
                "history": parent.num_tokens,
                "items": parent.num_items,
                "new": child.num_tokens - parent.num_tokens,
                "encoded": per_turn_tokens,
                "extend_ms": t_extend * 1e3,
                "full_ms": t_full * 1e3,
                "prompt_ms": t_prompt * 1e3,
                "prefix_us": t_prefix * 1e6,
                "final_ms": t_final * 1e3,
                "oracle_ms": t_oracle * 1e3,
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template", default="harmony", choices=["harmony", "chatml"])
    parser.add_argument("--encoding", default=None, help="encoding (default: the template's)")
    parser.add_argument("--min-tokens", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=131072)
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per cell (median)")
    parser.add_argument(
        "--oracle", action="store_true", help="also time openai-harmony's full render (harmony only)"
    )
    args = parser.parse_args(argv)
    sizes = []
    size = args.min_tokens
    while size <= args.max_tokens:
        sizes.append(size)
        size *= 2
    rows = run(args.template, args.encoding, sizes, args.repeat, args.oracle)
    name = get_renderer(args.template, encoding=args.encoding).name
    print(f"renderer {name}; one new turn per row; median of {args.repeat} runs\n")
    header = (
        f"{'history tok':>11} {'items':>6} {'new tok':>7} {'encoded':>7} "
        f"{'extend ms':>9} {'full ms':>9} {'full/ext':>8} {'prompt ms':>9} {'prefix us':>9} "
        f"{'final ms':>8}" + (f" {'harmony ms':>10} {'h/ext':>7}" if args.oracle else "")
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['history']:>11,.0f} {row['items']:>6.0f} {row['new']:>7.0f} {row['encoded']:>7.0f} "
            f"{row['extend_ms']:>9.3f} {row['full_ms']:>9.2f} {row['full_ms'] / row['extend_ms']:>7.0f}x "
            f"{row['prompt_ms']:>9.3f} {row['prefix_us']:>9.1f} {row['final_ms']:>8.3f}"
            + (f" {row['oracle_ms']:>10.2f} {row['oracle_ms'] / row['extend_ms']:>6.0f}x" if args.oracle else "")
        )
    first, last = rows[0], rows[-1]
    growth = last["history"] / first["history"]
    print(
        f"\nhistory grew {growth:.0f}x: extend time x{last['extend_ms'] / first['extend_ms']:.2f}, "
        f"full render x{last['full_ms'] / first['full_ms']:.1f}, "
        f"prompt materialization x{last['prompt_ms'] / first['prompt_ms']:.1f}"
    )


if __name__ == "__main__":
    main()
