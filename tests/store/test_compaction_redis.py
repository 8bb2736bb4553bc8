"""An automatic compaction with the Redis store: the compacted response is stored with its
compaction item, and another process continues from it — from the compacted log (the summary
and what followed), as the process that compacted would."""

from __future__ import annotations

from typing import Any

import httpx

from responses_cache import create_app
from responses_cache.conversation.sealing import Sealer, new_key
from responses_cache.storage.redis_store import RedisResponseStore
from responses_cache.testing import RecordingBackend, context_of

MODEL = "sim-1"


async def _post(app: Any, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        reply = await client.post("/v1/responses", json={"model": MODEL, "instructions": "Be brief.", **body})
    assert reply.status_code == 200, reply.text
    data: dict[str, Any] = reply.json()
    return data


async def test_another_process_continues_from_the_compacted_log(redis_url: str) -> None:
    key = new_key()
    backend_a, backend_b = RecordingBackend(), RecordingBackend()
    a = create_app(backend=backend_a, store=RedisResponseStore(redis_url), own_store=True, sealer=Sealer.from_text(key))
    b = create_app(backend=backend_b, store=RedisResponseStore(redis_url), own_store=True, sealer=Sealer.from_text(key))
    managed = [{"type": "compaction", "compact_threshold": 200}]
    async with a.router.lifespan_context(a), b.router.lifespan_context(b):
        previous = None
        compacted: dict[str, Any] = {}
        for n in range(10):
            response = await _post(
                a, {"input": f"step {n}: " + "fix it " * 12, "previous_response_id": previous, "context_management": managed}
            )
            previous = response["id"]
            if response["output"][0]["type"] == "compaction":
                compacted = response
                break
        assert compacted, "no compaction happened"
        # The same continuation on both processes: the one that compacted, and one from the store.
        here = await _post(a, {"input": "and then?", "previous_response_id": previous})
        there = await _post(b, {"input": "and then?", "previous_response_id": previous})
        assert here["status"] == there["status"] == "completed"
        assert context_of(backend_b.requests[-1]) == context_of(backend_a.requests[-1])
        assert len(backend_b.requests[-1].conversation.items()) == 3  # the summary, its answer, the new input
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=b), base_url="http://t") as client:
            stored = (await client.get(f"/v1/responses/{previous}")).json()
        assert stored["output"][0] == compacted["output"][0]
