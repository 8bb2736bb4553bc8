"""Who writes what: a turn's request part is made once at the edge, where it continues from is
found once, and what changes while it runs lives on its run."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from responses_cache import SimulatedEngine, create_service
from responses_cache.core.auth import AllowAll
from responses_cache.core.responder import EdgeContext
from responses_cache.pipeline.turn import Lineage
from responses_cache.protocol.request import decode_create


def test_the_request_part_of_a_turn_is_made_once() -> None:
    engine = SimulatedEngine()
    core = create_service(backend=engine, authenticator=AllowAll()).core
    request = decode_create(msgspec.json.encode({"model": engine.models()[0], "input": "hi"}))
    turn = core.prepare(request, "tenant", "http", edge=EdgeContext(headers={"authorization": "x"}, trace={"traceparent": "t"}))
    assert turn.headers == {"authorization": "x"} and turn.trace == {"traceparent": "t"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        turn.items = []  # type: ignore[misc]
    lineage = Lineage.first(turn)
    assert lineage.items is turn.items and lineage.parent is None and lineage.tier == "none"
    with pytest.raises(dataclasses.FrozenInstanceError):
        lineage.tier = "hot"  # type: ignore[misc]
