"""The process-wide cache budget and the retention policy."""

from __future__ import annotations

from test_session import create, state

from responses_cache.observability.metrics import InMemoryMetrics
from responses_cache.session.budget import CacheBudget
from responses_cache.session.session import Session, SessionConfig


def _session_with(nbytes: int, rid: str) -> Session:
    session = Session("t")
    session.receive(create(input="x"))
    (pending,) = session.startable()
    session.finished(pending, state(rid, nbytes=nbytes))
    return session


def test_least_recently_used_connections_give_way() -> None:
    metrics = InMemoryMetrics()
    budget = CacheBudget(max_bytes=250, metrics=metrics)
    a, b, c = _session_with(100, "a"), _session_with(100, "b"), _session_with(100, "c")
    budget.touch(a)
    budget.touch(b)
    budget.touch(a)  # a is used again: b is now the least recently used
    budget.touch(c)
    assert b.cache.latest == {} and metrics.total("cache_budget_evictions_total") == 1
    assert a.cache.find("a") is not None and c.cache.find("c") is not None
    assert budget.total_bytes == 200 and len(budget) == 2


def test_a_connection_larger_than_the_budget_is_not_cached() -> None:
    budget = CacheBudget(max_bytes=50)
    big = _session_with(100, "big")
    budget.touch(big)
    assert big.cache.latest == {} and budget.total_bytes == 0


def test_forget_releases_a_closed_connection() -> None:
    budget = CacheBudget(max_bytes=1000)
    s = _session_with(100, "s")
    budget.touch(s)
    budget.forget(s)
    assert budget.total_bytes == 0 and len(budget) == 0


def test_retain_token_log_false_drops_logs_from_the_cache() -> None:
    import dataclasses

    from responses_cache.protocol.tools import EMPTY_TOOLS
    from responses_cache.tokens import get_renderer

    renderer = get_renderer("harmony")
    log = renderer.begin(None, EMPTY_TOOLS)
    session = Session("t", SessionConfig(retain_token_log=False))
    session.receive(create(input="x"))
    (pending,) = session.startable()
    session.finished(pending, dataclasses.replace(state("r1"), token_log=log, fingerprint=b"f"))
    cached = session.cache.latest[None]
    assert cached.token_log is None and cached.fingerprint is None


def test_referenceable_items_count_in_the_budget_and_go_with_the_cache() -> None:
    from responses_cache.protocol.items import Message

    budget = CacheBudget(max_bytes=600)
    a, b = _session_with(100, "a"), _session_with(100, "b")
    a.items.add("t", [Message(role="assistant", content="x" * 200, id="msg_a")])
    budget.touch(a)
    assert budget.total_bytes == 100 + a.items.nbytes > 300
    b.items.add("t", [Message(role="assistant", content="y" * 200, id="msg_b")])
    budget.touch(b)  # 2 * (100 + ~290) > 600: a, the least recently used, gives way
    assert a.cache.latest == {} and a.items.get("t", "msg_a") is None
    assert b.items.get("t", "msg_b") is not None
