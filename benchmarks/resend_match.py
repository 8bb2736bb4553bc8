"""Cost of matching a full-input resend against the cached conversation, per item, side by side.

A WebSocket client without ``previous_response_id`` resends its whole conversation; the session
finds how much of it renders like the cached one (``tokens.key.reusable_prefix``). Three inputs of
the same conversation (a user question, a tool call, its output and an answer per step):

* ``identical``   — re-decoded from the server's own JSON (what the SDK resends): equal field for
  field, the cheap path (msgspec struct equality, no render key built);
* ``render-equal`` — ids and statuses stripped (a client that rebuilds its items): every pair's
  render keys are built and compared (this happens once: the cache then holds the client's items);
* ``full render`` — for scale, a harmony ``render_full`` of the same conversation (what the match
  saves).

    python benchmarks/resend_match.py
    python benchmarks/resend_match.py --items 8000 --repeat 10
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import msgspec

from responses_cache.protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Item,
    Message,
    OutputText,
)
from responses_cache.protocol.tools import EMPTY_TOOLS
from responses_cache.tokens import get_renderer
from responses_cache.tokens.key import reusable_prefix


def conversation(n: int) -> list[Item]:
    items: list[Item] = []
    for i in range(n // 4):
        items += [
            Message(role="user", content=[InputText(f"question {i} " * 20)]),
            FunctionCall(call_id=f"c{i}", name="run", arguments=f'{{"step": {i}}}', id=f"fc_{i}", status="completed"),
            FunctionCallOutput(call_id=f"c{i}", output=f"result {i} " * 50),
            Message(role="assistant", content=[OutputText(f"answer {i} " * 30)], id=f"msg_{i}", status="completed"),
        ]
    return items


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cached = conversation(args.items)
    n = len(cached)
    identical = msgspec.json.decode(msgspec.json.encode(cached), type=list[Message | FunctionCall | FunctionCallOutput])
    stripped = [msgspec.structs.replace(i, id=None, status=None) for i in cached]
    assert reusable_prefix(cached, identical, None) == (n, n)
    assert reusable_prefix(cached, stripped, None) == (n, 1)
    r = get_renderer("harmony")
    rows = [
        ("identical", best(lambda: reusable_prefix(cached, identical, None), args.repeat)),
        ("render-equal", best(lambda: reusable_prefix(cached, stripped, None), args.repeat)),
        ("full render", best(lambda: r.render_full(None, EMPTY_TOOLS, cached), args.repeat)),
    ]
    print(f"{n} items, best of {args.repeat}")
    print(f"{'input':<14}{'ms':>10}{'us/item':>10}{'x identical':>13}")
    base = rows[0][1]
    for name, seconds in rows:
        print(f"{name:<14}{seconds * 1e3:>10.2f}{seconds / n * 1e6:>10.2f}{seconds / base:>13.1f}")


if __name__ == "__main__":
    main()
