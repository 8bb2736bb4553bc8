"""The graceful stop, in process: the drain's bookkeeping, a session told the server drains, the
health endpoints, what new work gets during a drain, uvicorn's shutdown of a closing WebSocket,
and the start-up checks of ``serve`` (sealing key, renderer, model files)."""

from __future__ import annotations

import asyncio
import json
from unittest import mock

import pytest
from starlette.testclient import TestClient

from responses_cache import create_app
from responses_cache.core.lifecycle import Drain
from responses_cache.server.cli import main, server_config
from responses_cache.server.settings import load_settings
from responses_cache.session.session import GOING_AWAY, Session

CREATE = json.dumps({"type": "response.create", "model": "sim-1", "input": "hi"})


class Listener:
    def __init__(self) -> None:
        self.events: list[str] = []

    def drain_started(self) -> None:
        self.events.append("started")

    def drain_expired(self) -> None:
        self.events.append("expired")


async def test_a_drain_waits_for_its_work_and_cuts_what_outlives_the_deadline() -> None:
    drain = Drain()
    quick = asyncio.ensure_future(asyncio.sleep(0.05))
    drain.track(quick)
    listener = Listener()
    unwatch = drain.watch(listener)
    asyncio.get_running_loop().call_later(0.1, unwatch)  # the connection closes between turns
    assert await drain.run(5.0) is True
    assert drain.draining and not drain.expired and listener.events == ["started"] and quick.done()

    drain = Drain()
    slow = asyncio.ensure_future(asyncio.sleep(60))
    drain.track(slow)
    listener = Listener()
    drain.watch(listener)
    assert await drain.run(0.05) is False
    assert listener.events == ["started", "expired"]
    await asyncio.sleep(0)
    assert slow.cancelled()
    late = Listener()
    drain.watch(late)  # accepted in the race with the drain: told at once
    assert late.events == ["started", "expired"]


async def test_expire_stops_a_waiting_drain_at_once() -> None:
    drain = Drain()
    slow = asyncio.ensure_future(asyncio.sleep(60))
    drain.track(slow)
    running = asyncio.ensure_future(drain.run(60.0))
    await asyncio.sleep(0.01)
    drain.expire()  # a second signal
    assert await asyncio.wait_for(running, 1.0) is False
    assert slow.cancelled()


def test_an_idle_session_closes_going_away_without_an_error_event() -> None:
    session = Session("t")
    session.shutdown()
    assert session.close_code == GOING_AWAY == 1001
    assert session.drain() == []


def test_a_busy_session_refuses_new_work_and_closes_after_its_turn() -> None:
    session = Session("t")
    session.receive(CREATE)
    (running,) = session.startable()
    session.receive(CREATE)  # queued behind it on the default lane
    session.shutdown()
    refused = [event.error.code for event in session.drain()]  # type: ignore[attr-defined]
    assert refused == ["websocket_connection_limit_reached"]
    assert session.close_code is None  # never mid-answer
    session.receive(CREATE)
    (error,) = session.drain()
    assert error.error.code == "websocket_connection_limit_reached"  # type: ignore[attr-defined]
    assert "shutting down" in error.error.message  # type: ignore[attr-defined]
    session.finished(running, None)
    session.tick(0.0)
    assert session.close_code == 1001 and session.drain() == []


def test_health_needs_no_key_and_readiness_goes_unready_first() -> None:
    app = create_app(api_keys=["sk-1"])
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
        service = app.state.service
        assert client.post("/v1/responses", json={"model": "sim-1", "input": "hi"}).status_code == 401

        async def drain() -> bool:
            result: bool = await service.drain(1.0)
            return result

        assert client.portal.call(drain) is True  # type: ignore[union-attr]
        unready = client.get("/readyz")
        assert unready.status_code == 503 and unready.json() == {"status": "unready"}
        assert client.get("/healthz").status_code == 200
        refused = client.post("/v1/responses", json={"model": "sim-1", "input": "hi"}, headers={"authorization": "Bearer sk-1"})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "server_shutting_down"


def test_readiness_asks_the_store() -> None:
    app = create_app()
    with TestClient(app) as client:
        store = app.state.service.core.store
        store.ping = mock.AsyncMock(side_effect=ConnectionError("down"))
        assert client.get("/readyz").status_code == 503
        store.ping = mock.AsyncMock(return_value=None)
        assert client.get("/readyz").status_code == 200


async def test_uvicorn_shutdown_of_a_closing_websocket_does_not_raise() -> None:
    """uvicorn's shutdown sends 1012 on a connection whose peer's close frame is in: the
    websockets library raises InvalidState, which ended ``serve`` with status 1."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState
    from websockets.protocol import State

    from responses_cache.server.serving import linger_abort_protocol

    config = Config(app=create_app(), ws="websockets-sansio")
    config.load()
    protocol = linger_abort_protocol(1.0)(config=config, server_state=ServerState(), app_state={})
    transport = mock.Mock(spec=asyncio.Transport)
    transport.get_extra_info.return_value = None
    transport.is_closing.return_value = False
    protocol.connection_made(transport)
    protocol.handshake_complete = True
    protocol.initial_response = None
    protocol.conn.state = State.CLOSING  # the peer's close frame arrived, ours is not sent yet
    protocol.shutdown()
    assert transport.close.called or transport.abort.called or protocol.transport.is_closing()


def test_a_single_process_seals_with_a_key_of_its_own() -> None:
    config = server_config(load_settings(env={}))
    assert config.sealer is not None  # compaction works out of the box
    blob = config.sealer.seal("t", "compaction", b"x")
    assert config.sealer.open("t", "compaction", blob) == b"x"
    other = server_config(load_settings(env={}))  # another process (or this one restarted)
    with pytest.raises(ValueError):
        other.sealer.open("t", "compaction", blob)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--store", "redis://127.0.0.1:1/0"], "sealing_key: processes sharing a Redis store need one sealing key"),
        (["--renderer", "llama3"], "unknown template 'llama3'"),
        (["--renderer", "hf:/nonexistent/model"], "no tokenizer.json for '/nonexistent/model'"),
    ],
)
def test_a_setting_that_cannot_work_fails_at_start_in_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RESPONSES_CACHE_SEALING_KEY", raising=False)
    assert main(["serve", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
