"""Closing a backend's stream to the end, even while the turn is being cancelled.

Closing a backend's generator is what tells the engine to stop (the adapters close their HTTP
stream, the engine sees the disconnect and aborts the request). That close awaits (an HTTP
client's connection lock, the socket's close), and a turn may be cancelled again while it does:
a client that leaves while the turn is writing to it both fails the write and disconnects, and
a server that shuts down cancels turns that are already unwinding. A cancellation that lands
inside the close cuts it short: the generator is finished, but the HTTP client may have marked
the stream closed without closing its connection, and the engine then generates the whole
request for nobody.

:func:`close_stream` runs the close in a task of its own and waits for it to end whatever
happens to the waiting turn; a cancellation that arrived meanwhile is raised afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any


async def close_stream(stream: AsyncIterator[Any] | None) -> None:
    """Close ``stream`` (when it has ``aclose``) to the end. Its own error is raised; if the
    caller was cancelled while it closed, :class:`asyncio.CancelledError` is raised after it."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    closing = asyncio.ensure_future(aclose())
    cancelled = False
    while not closing.done():
        try:
            await asyncio.wait({closing})
        except asyncio.CancelledError:
            cancelled = True  # the close goes on in its task; the cancellation is raised below
    if cancelled:
        closing.exception()  # retrieved: a cancelled turn reports its cancellation, not this
        raise asyncio.CancelledError
    closing.result()
