"""Sealing: opaque blobs the server hands a client and later takes back, readable only by the
server and only for the tenant and purpose they were made for.

``Sealer(key).seal(tenant, purpose, data)`` encrypts and authenticates ``data`` with AES-256-GCM
(the ``cryptography`` package: ``pip install 'responses-cache[sealing]'``); the tenant and the
purpose are the associated data, so a blob opens only for the tenant it was sealed for and only
where it was sealed for (``"reasoning"`` for ``reasoning.encrypted_content``; a compaction feature
would use its own purpose with the same key). :meth:`Sealer.open` raises :class:`SealError` for a
blob that was altered, cut, sealed under another key, for another tenant or another purpose —
never a partial result.

A blob is ``rcs1.`` + base64url(nonce ‖ ciphertext ‖ tag), with a fresh random 96-bit nonce per
seal. Keys: 32 random bytes, given as base64 (``Sealer.from_text``); older keys may be passed
as ``previous`` so blobs sealed before a key rotation still open.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Sequence
from typing import Any

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
except ImportError:  # pragma: no cover - the extra is not installed
    AESGCM = None  # type: ignore[assignment,misc]
    InvalidTag = Exception  # type: ignore[assignment,misc]

KEY_BYTES = 32
_NONCE_BYTES = 12
_TAG_BYTES = 16
PREFIX = "rcs1."
_CONTEXT = b"responses-cache/sealed/v1\x00"


class SealError(ValueError):
    """A blob that does not open: not one of ours, altered, or sealed for another tenant or purpose."""


def new_key() -> str:
    """A fresh random key, as the base64 text :meth:`Sealer.from_text` takes."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


def _key(raw: bytes) -> bytes:
    if len(raw) != KEY_BYTES:
        raise ValueError(f"a sealing key is {KEY_BYTES} bytes (AES-256), not {len(raw)}")
    return raw


def _decode_key(text: str) -> bytes:
    try:
        return _key(base64.b64decode(text.strip(), validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"a sealing key is {KEY_BYTES} random bytes in base64 ({exc})") from None


class Sealer:
    """Seals and opens blobs bound to a tenant and a purpose (see the module's docstring)."""

    def __init__(self, key: bytes, *, previous: Sequence[bytes] = ()) -> None:
        if AESGCM is None:
            raise ImportError("sealing needs the cryptography package: pip install 'responses-cache[sealing]'")
        self._seal_with: Any = AESGCM(_key(key))
        self._open_with: list[Any] = [self._seal_with, *(AESGCM(_key(k)) for k in previous)]

    @classmethod
    def from_text(cls, key: str, *, previous: Sequence[str] = ()) -> Sealer:
        """A sealer from base64 keys (a ``serve`` setting, an environment variable)."""
        return cls(_decode_key(key), previous=[_decode_key(k) for k in previous])

    @staticmethod
    def _associated(tenant: str, purpose: str) -> bytes:
        return _CONTEXT + purpose.encode() + b"\x00" + tenant.encode("utf-8", "surrogatepass")

    def seal(self, tenant: str, purpose: str, data: bytes) -> str:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._seal_with.encrypt(nonce, data, self._associated(tenant, purpose))
        return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")

    def open(self, tenant: str, purpose: str, blob: str) -> bytes:
        """The data sealed in ``blob`` for this tenant and purpose; :class:`SealError` otherwise."""
        if not isinstance(blob, str) or not blob.startswith(PREFIX):
            raise SealError("not a blob sealed by this server")
        body = blob[len(PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            raise SealError("not valid base64") from None
        if len(raw) < _NONCE_BYTES + _TAG_BYTES:
            raise SealError("too short")
        nonce, sealed = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
        associated = self._associated(tenant, purpose)
        for aead in self._open_with:
            try:
                data: bytes = aead.decrypt(nonce, sealed, associated)
            except InvalidTag:
                continue
            return data
        raise SealError("the blob does not authenticate (altered, another key, another tenant or purpose)")
