"""The WebSocket connection's lifecycle, sans sockets: every state each transition leads to, and
what each state lets the connection's tasks do."""

from __future__ import annotations

import pytest

from responses_cache.edge.websocket import ConnectionLifecycle, ConnectionState

OPEN, CLOSING, BROKEN = ConnectionState.OPEN, ConnectionState.CLOSING, ConnectionState.BROKEN
ABORTED, FLUSHING, CLOSED = ConnectionState.ABORTED, ConnectionState.FLUSHING, ConnectionState.CLOSED


def _at(state: ConnectionState) -> ConnectionLifecycle:
    lifecycle = ConnectionLifecycle()
    lifecycle.state = state
    return lifecycle


def test_a_connection_starts_open() -> None:
    assert ConnectionLifecycle().state is OPEN


# (state, transition) -> the state after it; a pair absent here leaves the state as it is.
EXPECTED = {
    (OPEN, "close_sent"): CLOSING,
    (FLUSHING, "close_sent"): CLOSED,
    (OPEN, "write_failed"): BROKEN,
    (FLUSHING, "write_failed"): CLOSED,
    (OPEN, "abort"): ABORTED,
    (CLOSING, "abort"): ABORTED,
    (BROKEN, "abort"): ABORTED,
    (FLUSHING, "abort"): CLOSED,
    (OPEN, "stop"): FLUSHING,
    (CLOSING, "stop"): CLOSED,
    (BROKEN, "stop"): CLOSED,
    (ABORTED, "stop"): CLOSED,
}


@pytest.mark.parametrize("state", list(ConnectionState))
@pytest.mark.parametrize("transition", ["close_sent", "write_failed", "abort", "stop"])
def test_each_transition_from_each_state(state: ConnectionState, transition: str) -> None:
    lifecycle = _at(state)
    getattr(lifecycle, transition)()
    assert lifecycle.state is EXPECTED.get((state, transition), state)


def test_abort_acts_once() -> None:
    lifecycle = ConnectionLifecycle()
    assert lifecycle.abort() is True
    assert lifecycle.abort() is False  # already aborted: cancel nothing twice
    lifecycle.stop()
    assert lifecycle.abort() is False  # torn down after the abort


def test_stop_says_whether_the_connection_was_aborted() -> None:
    assert _at(ABORTED).stop() is True
    for state in (OPEN, CLOSING, BROKEN):
        assert _at(state).stop() is False


@pytest.mark.parametrize(
    ("state", "accepting", "writable", "stopped"),
    [
        (OPEN, True, True, False),
        (CLOSING, False, False, False),
        (BROKEN, False, False, False),
        (ABORTED, False, False, False),
        (FLUSHING, False, True, True),
        (CLOSED, False, False, True),
    ],
)
def test_what_each_state_allows(state: ConnectionState, accepting: bool, writable: bool, stopped: bool) -> None:
    lifecycle = _at(state)
    assert (lifecycle.accepting, lifecycle.writable, lifecycle.stopped) == (accepting, writable, stopped)


def test_a_peer_that_leaves_while_events_flush() -> None:
    """The reader ends with the socket writable: what is queued still goes out until a write
    fails, after which nothing is written, not even the close frame."""
    lifecycle = ConnectionLifecycle()
    assert lifecycle.stop() is False and lifecycle.writable and not lifecycle.accepting
    lifecycle.write_failed()
    assert lifecycle.state is CLOSED and not lifecycle.writable
