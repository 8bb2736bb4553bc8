"""Large buffers handed back to the system when they are freed (glibc).

A megabyte input makes a turn allocate a few blocks of its size (the frame, the decoded text, the
token array). glibc's ``malloc`` serves blocks over its mmap threshold with their own mappings,
returned to the system on ``free``, but it raises that threshold to the size of each such block
freed (up to 32 MiB): after the first large input, the next ones come from the heap, and a heap
whose top is pinned by a small live object keeps their pages after they are freed. A client that
flooded 8 MB frames left ``serve`` about 100 MiB larger once it was gone (108 and 116 MiB in two
rounds); with the threshold fixed, 22-38 MiB.

:func:`return_large_blocks` fixes the threshold (``mallopt(M_MMAP_THRESHOLD, ...)``, which also
turns the raising off). Blocks under it -- everything an ordinary turn allocates -- are served as
before. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes

from ..limits.memory import glibc_function

#: ``M_MMAP_THRESHOLD`` in glibc's ``malloc.h``.
_M_MMAP_THRESHOLD = -3
#: Blocks of at least this many bytes get their own mapping, unmapped when freed.
LARGE_BLOCK_BYTES = 1024 * 1024


def return_large_blocks(threshold: int = LARGE_BLOCK_BYTES) -> bool:
    """Serve blocks of ``threshold`` bytes or more from their own mappings, returned to the
    system when freed; ``True`` when the allocator took the setting (glibc only)."""
    mallopt = glibc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
