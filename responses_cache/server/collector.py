"""The cyclic garbage collector kept off what ``serve`` holds for its whole life.

Once ``serve`` has built its app (modules, the renderer and its vocabulary, the backend) it holds
some 60,000 objects the garbage collector tracks, none of which will ever be garbage. Every full
collection walks them all: 34-45 ms on a 2-core VM, during which the event loop serves no
connection. Python starts a full collection whenever the objects that survived since the last
one reach a quarter of those it holds, so a server whose caches grow pays that pause again and
again, in the middle of whatever turns are streaming.

:func:`freeze_startup_objects` collects once and moves everything left into the permanent
generation (:func:`gc.freeze`): later collections walk only what was made after the start. The
objects are not made immortal, only never examined again by the collector; what the process
frees of them is freed as before (reference counting).
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect, then leave every object that survived out of later collections; returns how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
