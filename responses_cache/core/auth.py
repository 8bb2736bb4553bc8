"""Authentication of HTTP requests and WebSocket upgrades: the ``Authenticator`` protocol.

An authenticator maps the request headers to a **tenant** (or ``None`` to reject). The tenant
scopes everything stored: the durable store, usage records and the connection's cache.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Protocol


class Authenticator(Protocol):
    async def authenticate(self, headers: Mapping[str, str]) -> str | None:
        """The tenant for these request headers, or ``None`` when they are not authorized."""
        ...


class AllowAll:
    """No authentication: every request belongs to ``tenant``. For development and for servers
    behind an authenticating proxy; nothing defaults to it silently except ``create_app()`` with
    neither ``api_keys`` nor ``authenticator`` (the local reference server)."""

    def __init__(self, tenant: str = "default") -> None:
        self.tenant = tenant

    async def authenticate(self, headers: Mapping[str, str]) -> str | None:
        return self.tenant


class BearerKeys:
    """``Authorization: Bearer <key>`` against a set of keys, compared in constant time.

    ``keys`` is either a list of keys (each key is its own tenant, named by a hash prefix) or a
    mapping of key → tenant name.
    """

    def __init__(self, keys: Iterable[str] | Mapping[str, str]) -> None:
        pairs = keys.items() if isinstance(keys, Mapping) else ((k, _tenant_of(k)) for k in keys)
        self._keys = [(hashlib.sha256(k.encode()).digest(), tenant) for k, tenant in pairs]
        if not self._keys:
            raise ValueError("BearerKeys needs at least one key")

    async def authenticate(self, headers: Mapping[str, str]) -> str | None:
        value = headers.get("authorization", "")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        digest = hashlib.sha256(token.strip().encode()).digest()
        found: str | None = None
        for key, tenant in self._keys:  # check every key: timing does not reveal which matched
            if hmac.compare_digest(digest, key):
                found = tenant
        return found


def tenant_of_key(key: str) -> str:
    """The tenant :class:`BearerKeys` gives a key listed without a name (``key-`` and a hash prefix)."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


_tenant_of = tenant_of_key
