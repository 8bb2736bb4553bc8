"""Giving memory a client made the server allocate back to the operating system once it is gone.

Freed memory is not returned by itself. CPython hands blocks over 512 bytes (a frame's text,
its decoded input, token arrays) to the C allocator, and glibc's ``malloc`` keeps freed heap
memory for reuse, returning only what lies at the very top of its heap; after a free of a large
mapped block it also raises its threshold for mapping (up to 32 MiB), so the next large blocks
land in the heap too. A client that sent a few large frames thus leaves the process tens of MiB
larger after it has gone (measured: +67 MB after a flood of 8 MB frames), until later traffic
happens to reuse the space.

``responses-cache serve`` fixes that threshold (:mod:`responses_cache.server.allocator`), so
large blocks leave when freed; the heaps still keep free pages between live objects.
:func:`release_free_memory` asks glibc to give back every free page (``malloc_trim(0)``: a few
milliseconds for a heap of hundreds of MiB). The WebSocket edge calls it, off the event loop,
when a connection that took at least :data:`RELEASE_AFTER_BYTES` of frames closes (under any
server). On other C libraries it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import threading
from collections.abc import Callable
from typing import Any

#: A connection that took at least this many bytes of frames returns free memory when it closes.
RELEASE_AFTER_BYTES = 8 * 1024 * 1024

_lock = threading.Lock()


def glibc_function(name: str) -> Any | None:
    """The C library's function ``name`` (a ctypes function), or ``None`` off Linux's glibc (its
    allocator calls do nothing elsewhere, or are missing: musl has neither ``mallopt`` nor
    ``malloc_trim``)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return getattr(libc, name)
    except (OSError, AttributeError):
        return None


_trim: Callable[[int], int] | None = glibc_function("malloc_trim")


def release_free_memory() -> bool:
    """Return the C allocator's free pages to the operating system (glibc); ``False`` when not
    done: another call is under way (it returns the same pages) or the C library has no such
    call. Blocks for a few milliseconds: call it off the event loop."""
    if _trim is None or not _lock.acquire(blocking=False):
        return False
    try:
        _trim(0)
    finally:
        _lock.release()
    return True
