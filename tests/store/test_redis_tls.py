"""``rediss://`` for real: the store talks TLS, verifying the server's certificate against the CA
the URL names. The ``redis-server`` the test extra ships is built without TLS, so a TLS
terminator (Python's ``ssl``, a certificate made here with ``cryptography``) stands in front of
it, as a managed service's endpoint or stunnel would; it accepts nothing but TLS."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from responses_cache.protocol.ids import new_response_id
from responses_cache.protocol.items import Message
from responses_cache.protocol.response import Response
from responses_cache.storage.redis_store import RedisResponseStore, StoreUnavailable
from responses_cache.storage.store import StoredResponse


def _certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class TlsTerminator:
    """Accepts TLS on a loopback port and relays the plaintext to ``redis_port``."""

    def __init__(self, redis_port: int, cert: Path, key: Path) -> None:
        self.redis_port = redis_port
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.handshakes = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        return int(self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(BaseException):
                await task
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1  # the server hands over a connection only after a TLS handshake
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.redis_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        for task in (asyncio.create_task(pipe(reader, up_writer)), asyncio.create_task(pipe(up_reader, writer))):
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)


@pytest.fixture
async def tls(single_redis_url: str, tmp_path: Path) -> AsyncIterator[tuple[int, Path, TlsTerminator]]:
    """The TLS port in front of the session's server, the CA file that vouches for it, and the
    terminator."""
    cert, key = _certificate(tmp_path, "redis")
    terminator = TlsTerminator(int(single_redis_url.rsplit(":", 1)[1].split("/")[0]), cert, key)
    async with terminator as port:
        yield port, cert, terminator


def _stored(rid: str, parent: str | None) -> StoredResponse:
    response = Response(
        id=rid, created_at=1, status="completed", model="sim-1", output=[Message(role="assistant", content="hi")],
        tools=msgspec.Raw(b"[]"), tool_choice="auto", parallel_tool_calls=True, previous_response_id=parent,
    )
    return StoredResponse("t", response, (Message(role="user", content="hello"),), None, b"[]", None)


async def test_rediss_verifies_the_server_and_stores_over_tls(tls: tuple[int, Path, TlsTerminator]) -> None:
    port, ca, terminator = tls
    store = RedisResponseStore(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}")
    try:
        first = new_response_id()
        second = new_response_id(first)
        await store.put(_stored(first, None))
        await store.put(_stored(second, first))
        chain = await store.get_chain("t", second)
        assert chain is not None and [s.id for s in chain] == [first, second]
        assert terminator.handshakes >= 1
    finally:
        await store.aclose()


async def test_rediss_refuses_a_server_its_ca_does_not_vouch_for(tls: tuple[int, Path, TlsTerminator], tmp_path: Path) -> None:
    port, _, _ = tls
    other_ca, _ = _certificate(tmp_path, "other")
    store = RedisResponseStore(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={other_ca}")
    try:
        with pytest.raises(StoreUnavailable):
            await store.get_chain("t", new_response_id())
    finally:
        await store.aclose()


async def test_plain_redis_to_a_tls_port_is_unavailable_not_plaintext(tls: tuple[int, Path, TlsTerminator]) -> None:
    port, _, terminator = tls
    store = RedisResponseStore(f"redis://127.0.0.1:{port}/0")
    try:
        with pytest.raises(StoreUnavailable):
            await store.get_chain("t", new_response_id())
        assert terminator.handshakes == 0
    finally:
        await store.aclose()
