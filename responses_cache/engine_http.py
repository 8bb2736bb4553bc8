"""``responses_cache.engine_http``, the documented import path of :mod:`responses_cache.backends.http`
(the HTTP client an engine adapter streams over; needs ``httpx`` and ``httpx-aiohttp``).

It re-exports that module's public names. Patch or extend the module itself, not this one."""

from .backends.http import engine_client, engine_transport

__all__ = ["engine_client", "engine_transport"]
