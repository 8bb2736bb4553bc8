"""The connection cache's operations (what a session asks of it), and the budget asking a session
to give its cache up: each object changes only its own state."""

from __future__ import annotations

import dataclasses

import pytest
from test_session import create, state

from responses_cache.observability.metrics import InMemoryMetrics
from responses_cache.protocol.items import Message
from responses_cache.session.budget import CacheBudget
from responses_cache.session.session import ConnectionCache, Session

MSG = Message(role="user", content="hi")


def test_parent_says_whether_the_lane_moved_on() -> None:
    cache = ConnectionCache(keep_superseded=2, grace_s=5.0)
    r1 = state("r1", "a", (MSG,))
    r2 = dataclasses.replace(state("r2", "a"), conversation=r1.conversation.extend([MSG]))
    cache.put("a", r1, now=100.0)
    assert cache.parent("r1", 100.0) == (r1, False)  # the lane's latest
    cache.put("a", r2, now=101.0)
    assert cache.parent("r2", 101.0) == (r2, False)
    assert cache.parent("r1", 102.0) == (r1, True)  # superseded, inside the grace period
    assert cache.parent("r1", 106.0) is None  # expired
    assert cache.parent("nope", 106.0) is None


def test_latest_on_a_lane() -> None:
    cache = ConnectionCache()
    r1, r2 = state("r1", "a"), state("r2")
    cache.put("a", r1)
    cache.put(None, r2)
    assert cache.latest_on("a") is r1 and cache.latest_on(None) is r2 and cache.latest_on("b") is None


def test_what_it_holds_is_read_only_from_outside() -> None:
    cache = ConnectionCache(keep_superseded=1, grace_s=5.0)
    r1 = state("r1", "a", (MSG,))
    cache.put("a", r1)
    cache.put("a", dataclasses.replace(state("r2", "a"), conversation=r1.conversation.extend([MSG])))
    with pytest.raises(TypeError):
        cache.latest["b"] = r1  # type: ignore[index]
    assert isinstance(cache.superseded, tuple) and [s.id for _, s, _ in cache.superseded] == ["r1"]


def test_shrink_to_drops_superseded_first_then_the_least_recently_updated_lanes() -> None:
    cache = ConnectionCache(keep_superseded=2, grace_s=60.0)
    a1 = state("a1", "a", (MSG,))
    cache.put("a", a1)
    cache.put("a", dataclasses.replace(state("a2", "a"), conversation=a1.conversation.extend([MSG])))  # 2 items
    cache.put("b", state("b1", "b", (MSG, MSG)))  # 2 items
    cache.put("c", state("c1", "c", (MSG,)))  # 1 item
    cache.shrink_to(max_items=5, max_bytes=10**9)  # fits: nothing goes
    assert set(cache.latest) == {"a", "b", "c"} and len(cache.superseded) == 1
    cache.shrink_to(max_items=3, max_bytes=10**9)
    assert set(cache.latest) == {"b", "c"} and len(cache.superseded) == 0  # a was least recently updated
    cache.shrink_to(max_items=0, max_bytes=10**9)
    assert cache.latest == {}


def test_shrink_to_bounds_bytes_too() -> None:
    cache = ConnectionCache()
    cache.put("a", state("a1", "a", nbytes=600))
    cache.put("b", state("b1", "b", nbytes=600))
    cache.shrink_to(max_items=10**9, max_bytes=1000)
    assert set(cache.latest) == {"b"}


def _session_with(nbytes: int, rid: str, session: Session | None = None) -> Session:
    session = session if session is not None else Session("t")
    session.receive(create(input="x"))
    (pending,) = session.startable()
    session.finished(pending, state(rid, nbytes=nbytes))
    return session


def test_a_session_reports_and_drops_what_it_caches() -> None:
    session = _session_with(100, "r1")
    session.items.add("t", [Message(role="assistant", content="x" * 50, id="msg_1")])
    assert session.cached_bytes == 100 + session.items.nbytes > 100
    session.drop_cache()
    assert session.cached_bytes == 0 and session.cache.latest == {} and session.items.get("t", "msg_1") is None


def test_the_budget_asks_the_least_recently_used_session_to_drop_its_cache() -> None:
    metrics = InMemoryMetrics()
    budget = CacheBudget(max_bytes=250, metrics=metrics)
    dropped: list[str] = []

    class Recording(Session):
        def drop_cache(self) -> None:
            dropped.append(self.tenant)
            super().drop_cache()

    a, b, c = (_session_with(100, name, Recording(name)) for name in "abc")
    budget.touch(a)
    budget.touch(b)
    budget.touch(c)  # over 250: a, the least recently used, gives way
    assert dropped == ["a"] and a.cached_bytes == 0 and b.cached_bytes == c.cached_bytes == 100
    assert metrics.total("cache_budget_evictions_total") == 1 and budget.total_bytes == 200
    budget.forget(b)
    budget.touch(_session_with(300, "big"))  # alone over the budget: dropped, not an eviction
    assert metrics.total("cache_budget_evictions_total") == 1 and len(budget) == 1
