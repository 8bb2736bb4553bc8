"""Server-side memory accounting of the connection caches, without tracemalloc.

Runs inside the server process (see :mod:`.runner`): finds every live WebSocket
:class:`~responses_cache.session.session.Session` through the garbage collector and sums the sizes of the
objects its cached :class:`~responses_cache.storage.state.ResponseState` values hold, each object counted
once even when states share it. The categories say where cache memory goes:

* ``token_log`` — token-log nodes and their ``array('I')`` segments;
* ``conversation`` — conversation nodes and the input/output items they hold: decoded objects, or
  the packed form of a node behind the newest (:mod:`responses_cache.conversation.packing`);
* ``response`` — the Response objects (what ``response.completed`` echoes);
* ``other`` — open calls and hook state.

Buffers that a ``msgspec.Raw`` keeps alive are invisible to ``sys.getsizeof``; the difference
between the RSS delta and this sum is such hidden memory plus allocator overhead.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


class _Walker:
    def __init__(self) -> None:
        self.seen: set[int] = set()

    def deep(self, roots: Iterable[object]) -> int:
        """Total size of everything reachable from ``roots`` not counted before."""
        total = 0
        stack = list(roots)
        while stack:
            obj = stack.pop()
            if isinstance(obj, _OPAQUE) or id(obj) in self.seen:
                continue
            self.seen.add(id(obj))
            total += sys.getsizeof(obj)
            stack.extend(gc.get_referents(obj))
        return total

    def token_log(self, log: Any) -> int:
        total = 0
        node = getattr(log, "_node", None)
        while node is not None and id(node) not in self.seen:
            self.seen.add(id(node))
            total += sys.getsizeof(node)
            for part in (node.seg, node.facts, node.call_id, node.call_target):
                if part is not None and id(part) not in self.seen:
                    self.seen.add(id(part))
                    total += sys.getsizeof(part)
            node = node.parent
        return total

    def conversation(self, conversation: Any) -> int:
        total = 0
        node = conversation
        while node is not None and id(node) not in self.seen:
            self.seen.add(id(node))
            total += sys.getsizeof(node)
            total += self.deep([node.held])  # not ``own_items``: that unpacks a packed node
            node = node.parent
        return total


def cache_footprint(of: Iterable[Any] | None = None) -> dict[str, Any]:
    """Bytes held by every live connection cache (or by the sessions ``of``), by category, and
    the tokens they cache."""
    from responses_cache.session.session import Session

    gc.collect()
    sessions = list(of) if of is not None else [o for o in gc.get_objects() if isinstance(o, Session)]
    walker = _Walker()
    sizes = {"token_log": 0, "conversation": 0, "response": 0, "other": 0}
    tokens = 0
    states = 0
    for session in sessions:
        for state in list(session.cache.latest.values()):
            states += 1
            if state.token_log is not None:
                tokens += state.token_log.num_tokens
                sizes["token_log"] += walker.token_log(state.token_log)
            sizes["conversation"] += walker.conversation(state.conversation)
            sizes["response"] += walker.deep([state.response])
            sizes["other"] += walker.deep([state.open_calls, state.hook_state])
    return {
        "sessions": len(sessions),
        "states": states,
        "cached_tokens": tokens,
        "bytes": sizes,
        "total_bytes": sum(sizes.values()),
    }


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process, from ``/proc/<pid>/status`` (0 where unavailable)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def cpu_seconds(pid: int | str = "self") -> float:
    """CPU time a process's live threads have used, to the nanosecond (Linux's ``schedstat``;
    ``/proc/<pid>/stat`` counts 10 ms ticks, too coarse for a few turns); 0 where unavailable."""
    total = 0
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that just ended
                total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9
