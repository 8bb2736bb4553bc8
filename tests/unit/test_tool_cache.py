"""The process-wide tool-list cache: bounded in bytes, filled only by turns that succeeded.

Memory is measured by what the cache retains (entries and bytes held), never by timing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from responses_cache import SimulatedConfig, SimulatedEngine, create_app
from responses_cache.protocol.tools import ToolCache, parse_tools, tool_cache


def _tools(i: int, size: int) -> list[dict[str, Any]]:
    return [{"type": "function", "name": f"f{i}", "description": "x" * size, "parameters": {"type": "object"}}]


@pytest.fixture
def small_cache() -> Iterator[ToolCache]:
    before = tool_cache.max_bytes
    tool_cache.resize(1024 * 1024)
    yield tool_cache
    tool_cache.resize(before)


async def _post(app: Any, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t/v1") as c:
        return await c.post("/responses", json=body)


async def test_rejected_requests_leave_nothing_in_the_cache(small_cache: ToolCache) -> None:
    app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=2)), tool_cache_bytes=1024 * 1024)
    rejections = [
        {"previous_response_id": "resp_unknown"},  # rejected after the tools were parsed
        {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},  # validation
        {"max_output_tokens": "x"},  # the body itself
    ]
    for i in range(40):
        body = {"model": "sim-1", "input": "hi", "tools": _tools(i, 64 * 1024), **rejections[i % 3]}
        response = await _post(app, body)
        assert response.status_code == 400, response.text
    assert len(small_cache) == 0 and small_cache.bytes_held == 0


async def test_the_cache_is_bounded_in_bytes_across_successful_turns(small_cache: ToolCache) -> None:
    app = create_app(backend=SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=2)), tool_cache_bytes=1024 * 1024)
    assert small_cache.max_bytes == 1024 * 1024
    for i in range(30):
        response = await _post(app, {"model": "sim-1", "input": "hi", "tools": _tools(i, 64 * 1024)})
        assert response.status_code == 200, response.text
        assert small_cache.bytes_held <= small_cache.max_bytes
    assert 0 < len(small_cache) < 30  # the oldest gave way


def test_a_list_larger_than_the_whole_budget_is_not_kept() -> None:
    cache = ToolCache(max_bytes=10_000)
    big = parse_tools(json.dumps(_tools(0, 50_000)).encode())
    cache.remember(big)
    assert len(cache) == 0 and cache.bytes_held == 0
    small = parse_tools(json.dumps(_tools(1, 10)).encode())
    cache.remember(small)
    assert cache.get(small.fingerprint) is small and cache.bytes_held > 0
