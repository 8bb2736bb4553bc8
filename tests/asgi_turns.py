"""Turns through an app's HTTP API in this process (httpx's ASGI transport, no sockets), for the
tests that count the work a turn does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from responses_cache.tokens import BaseRenderer

MODEL = "sim-1"


def asgi_client(app: Any) -> httpx.AsyncClient:
    """A client of the app's ``/v1`` API through httpx's ASGI transport."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t/v1")


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Let the event loop run until ``predicate()`` holds (what the app finishes after its
    answer: a charge settled, a record written); fails after ``timeout`` seconds (a deadline,
    not a measurement: work that waits on a real Redis takes round trips, not loop passes, and a
    loaded machine makes those slow)."""
    deadline = asyncio.get_running_loop().time() + timeout
    passes = 0
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"the condition never held (waited {timeout:g} s)")
        passes += 1
        await asyncio.sleep(0 if passes < 1000 else 0.001)  # then stop spinning


async def post(app: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """``POST path`` with ``body`` (and ``model``); the 200 answer's JSON."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        reply = await client.post(path, json={"model": MODEL, **body})
    assert reply.status_code == 200, reply.text
    data: dict[str, Any] = reply.json()
    return data


async def conversation(app: Any, turns: int) -> str:
    """A chain of ``turns`` responses (each about 60 tokens of new input); the last one's id."""
    previous = None
    for k in range(turns):
        body: dict[str, Any] = {"input": f"turn {k}: " + "words " * 50}
        if previous:
            body["previous_response_id"] = previous
        previous = (await post(app, "/v1/responses", body))["id"]
    assert previous is not None
    return previous


def renderer_of(app: Any) -> BaseRenderer:
    """The renderer the app's router gives :data:`MODEL` (whose ``stats`` count the work)."""
    renderer = app.state.service.core.router.resolve(MODEL, "").renderer
    assert isinstance(renderer, BaseRenderer)
    return renderer
