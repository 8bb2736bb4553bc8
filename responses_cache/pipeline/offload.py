"""The tokenizer offload: big renders run on a small pool of low-priority worker threads.

tiktoken releases the GIL, so a render on a worker thread leaves the event loop to every other
connection; a flood of huge prompts then slows down its own renders, not the loop's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from ..protocol.items import Item
from ..storage.state import ResponseState
from .render import text_chars

T = TypeVar("T")


def lower_priority() -> None:
    """Run a tokenizer thread at a lower CPU priority than the event loop (Linux schedules threads
    individually), so a flood of huge prompts slows down its own renders, not every connection."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10))


def render_size(parent: ResponseState | None, items: list[Item]) -> int:
    """Characters a render will tokenize, about: the new items, plus the whole history when the
    parent has no token log to extend (a full render)."""
    size = text_chars(items)
    if parent is not None and parent.token_log is None:
        size += parent.total_bytes
    return size


class TokenizerPool:
    """The worker threads (started on first use; more renders wait their turn, off the loop)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    async def run(self, call: Callable[[], T]) -> T:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.threads, thread_name_prefix="responses-cache-render", initializer=lower_priority
            )
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        """Stop the threads (idle ones exit at once; running renders finish)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
