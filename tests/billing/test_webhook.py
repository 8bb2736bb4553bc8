"""WebhookSink against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from responses_cache.billing import Biller, WebhookError, WebhookSink
from responses_cache.testing import WebhookReceiver

from .conftest import ids, make_record


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver


def fast_sink(url: str, **kwargs: object) -> WebhookSink:
    return WebhookSink(url, backoff_initial=0.001, backoff_max=0.01, **kwargs)  # type: ignore[arg-type]


async def test_retries_until_success(receiver: WebhookReceiver) -> None:
    receiver.fail_next = 3
    sink = fast_sink(receiver.url, max_attempts=5, headers={"Authorization": "Bearer k"})
    batch = [make_record(i) for i in range(4)]
    await sink.write(batch)
    await sink.close()
    assert len(receiver.requests) == 4
    keys = {headers["Idempotency-Key"] for headers, _ in receiver.requests}
    assert keys == {WebhookSink.idempotency_key(batch)}  # stable across retries
    assert all(h["Authorization"] == "Bearer k" for h, _ in receiver.requests)
    assert receiver.received.keys() == ids(4)
    assert receiver.received["resp_000001"][0]["previous_response_id"] == "resp_000000"


async def test_single_record_key_is_the_response_id(receiver: WebhookReceiver) -> None:
    sink = fast_sink(receiver.url)
    await sink.write([make_record(7)])
    await sink.close()
    assert receiver.requests[0][0]["Idempotency-Key"] == "resp_000007"
    assert WebhookSink.idempotency_key([make_record(1), make_record(2)]).startswith("batch-")
    assert WebhookSink.idempotency_key(
        [make_record(1), make_record(2)]
    ) == WebhookSink.idempotency_key([make_record(2), make_record(1)])


async def test_gives_up_after_max_attempts(receiver: WebhookReceiver) -> None:
    receiver.down = True
    receiver.retry_after = "0"
    sink = fast_sink(receiver.url, max_attempts=3)
    with pytest.raises(WebhookError) as info:
        await sink.write([make_record(1)])
    await sink.close()
    assert info.value.status_code == 503
    assert len(receiver.requests) == 3


async def test_client_errors_are_not_retried(receiver: WebhookReceiver) -> None:
    receiver.fail_next = 1
    receiver.fail_status = 400
    sink = fast_sink(receiver.url, max_attempts=5)
    with pytest.raises(WebhookError):
        await sink.write([make_record(1)])
    await sink.close()
    assert len(receiver.requests) == 1


async def test_connection_errors_are_retried() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = fast_sink(f"http://127.0.0.1:{port}/", max_attempts=2)
    import httpx

    with pytest.raises(httpx.TransportError):
        await sink.write([make_record(1)])
    await sink.close()


async def test_biller_survives_a_long_webhook_outage(receiver: WebhookReceiver, tmp_path: Path) -> None:
    """Down for many batches (each exhausting its retries), then back: every id once."""
    receiver.down = True
    sink = fast_sink(receiver.url, max_attempts=2)
    biller = Biller(
        sink,
        batch_size=16,
        flush_interval=0,
        retry_interval=0.001,
        max_retry_interval=0.005,
        journal_path=tmp_path / "billing.journal",
    )
    async with biller:
        for i in range(200):
            biller.submit(make_record(i))
            if i % 40 == 39:
                assert not await biller.flush()
        assert biller.stats().degraded
        assert biller.pending == 200 and biller.stats().in_memory == 0  # all in the journal
        receiver.down = False
        assert await biller.flush()
    assert receiver.received.keys() == ids(200)
    assert max(len(copies) for copies in receiver.received.values()) == 1
    assert biller.delivered == 200
    assert (tmp_path / "billing.journal").stat().st_size == 0


async def test_flaky_webhook_with_biller(receiver: WebhookReceiver) -> None:
    """Fails N times then succeeds, within the sink's own retries: nothing waits for a retry."""
    receiver.fail_next = 2
    biller = Biller(fast_sink(receiver.url, max_attempts=4), batch_size=10, flush_interval=0)
    async with biller:
        for i in range(50):
            biller.submit(make_record(i))
        assert await biller.flush()
    assert receiver.received.keys() == ids(50)
    assert biller.stats().sink_errors == 0


def test_missing_extra_has_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(ImportError, match=r"responses-cache\[webhook\]"):
        WebhookSink("http://127.0.0.1:1/")


def test_invalid_max_attempts() -> None:
    with pytest.raises(ValueError):
        WebhookSink("http://127.0.0.1:1/", max_attempts=0)
