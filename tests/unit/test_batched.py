"""``responses_cache.engines.batched``: an engine's stream handed over in lists of what arrived
while the turn was busy — never waiting for a batch to fill, in order, errors after the items
before them, bounded read-ahead, and nothing left running once it is closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import anyio
import pytest

from responses_cache import ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart
from responses_cache.engines import batched, merge_deltas


async def _burst(n: int) -> AsyncGenerator[int, None]:
    """``n`` items that arrive together (as chunks already in a socket's buffer do)."""
    for i in range(n):
        yield i


async def _collect(source: AsyncGenerator[int, None], limit: int = 256) -> list[list[int]]:
    async with contextlib.aclosing(batched(source, limit)) as batches:
        return [batch async for batch in batches]


def test_items_that_arrive_together_are_handed_over_as_one() -> None:
    assert asyncio.run(_collect(_burst(50))) == [list(range(50))]


def test_an_item_that_arrives_alone_is_handed_over_before_the_next_exists() -> None:
    async def run() -> list[str]:
        log: list[str] = []
        gate = asyncio.Event()

        async def paced() -> AsyncGenerator[int, None]:
            for i in range(3):
                log.append(f"made {i}")
                yield i
                await gate.wait()  # the next one comes only once the consumer has this one
                gate.clear()

        async with contextlib.aclosing(batched(paced())) as batches:
            async for batch in batches:
                log.append(f"took {batch}")
                gate.set()
        return log

    assert asyncio.run(run()) == ["made 0", "took [0]", "made 1", "took [1]", "made 2", "took [2]"]


def test_a_busy_consumer_takes_what_queued_meanwhile_in_order() -> None:
    async def run() -> list[list[int]]:
        async def ticking() -> AsyncGenerator[int, None]:
            for i in range(12):
                await asyncio.sleep(0)
                yield i

        taken: list[list[int]] = []
        async with contextlib.aclosing(batched(ticking())) as batches:
            async for batch in batches:
                taken.append(batch)
                for _ in range(5):  # the consumer is busy for a few loop turns
                    await asyncio.sleep(0)
        return taken

    taken = asyncio.run(run())
    assert [i for batch in taken for i in batch] == list(range(12))
    assert len(taken) < 12 and max(len(batch) for batch in taken) > 1


def test_an_error_comes_after_the_items_before_it() -> None:
    async def failing() -> AsyncGenerator[int, None]:
        yield 1
        yield 2
        raise ValueError("the engine broke")

    seen: list[int] = []

    async def run() -> None:
        async with contextlib.aclosing(batched(failing())) as batches:
            async for batch in batches:
                seen.extend(batch)

    with pytest.raises(ValueError, match="the engine broke"):
        asyncio.run(run())
    assert seen == [1, 2]


def test_the_read_stays_at_most_limit_items_ahead_of_a_consumer_that_does_not_take() -> None:
    async def run() -> tuple[int, int]:
        made = 0

        async def endless() -> AsyncGenerator[int, None]:
            nonlocal made
            while True:
                made += 1
                yield made
                await asyncio.sleep(0)

        async with contextlib.aclosing(batched(endless(), limit=8)) as batches:
            first = await batches.__anext__()
            for _ in range(50):  # the consumer stops taking
                await asyncio.sleep(0)
            return len(first), made

    first, made = asyncio.run(run())
    assert first <= 8 and made <= first + 8


def test_closing_the_batches_closes_the_source_and_leaves_no_task() -> None:
    async def run() -> tuple[bool, set[asyncio.Task[object]]]:
        closed = False
        hang = asyncio.Event()

        async def hanging() -> AsyncGenerator[int, None]:
            nonlocal closed
            try:
                yield 1
                await hang.wait()  # an engine that stalls mid-answer
                yield 2
            finally:
                closed = True

        batches = batched(hanging())
        assert await batches.__anext__() == [1]
        await batches.aclose()
        return closed, asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    closed, left = asyncio.run(run())
    assert closed and not left


def test_cancelling_the_consumer_closes_the_source() -> None:
    async def run() -> bool:
        closed = asyncio.Event()

        async def hanging() -> AsyncGenerator[int, None]:
            try:
                yield 1
                await asyncio.Event().wait()
            finally:
                closed.set()

        async def consume() -> None:
            async with contextlib.aclosing(batched(hanging())) as batches:
                async for _ in batches:
                    pass

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return closed.is_set()

    assert asyncio.run(run())


def test_closing_while_the_read_waits_for_room_closes_the_source() -> None:
    async def run() -> bool:
        closed = False

        async def plenty() -> AsyncGenerator[int, None]:
            nonlocal closed
            try:
                for i in range(100):
                    yield i  # the reader waits for room here, the source suspended at its yield
            finally:
                closed = True

        batches = batched(plenty(), limit=1)
        await batches.__anext__()
        await asyncio.sleep(0)
        await batches.aclose()
        return closed

    assert asyncio.run(run())


def test_closing_on_the_last_item_lets_the_sources_shielded_cleanup_finish() -> None:
    """The consumer closes on the engine's last chunk while the reader is still finishing the
    source, whose cleanup is shielded (httpx hands the connection back to its pool so): the
    cleanup runs to its end. A plain ``Task.cancel()`` lands inside the shield and cuts it short,
    which left one pooled connection checked out per turn."""

    async def run() -> list[str]:
        log: list[str] = []

        async def stream() -> AsyncGenerator[int, None]:
            try:
                yield 1
            finally:
                with anyio.CancelScope(shield=True):
                    await asyncio.sleep(0.01)  # the pool's lock, the connection's state
                    log.append("released")

        async with contextlib.aclosing(batched(stream())) as batches:
            async for batch in batches:
                log.append(f"took {batch}")
                break  # the last chunk: the consumer is done
        log.append("closed")
        return log

    assert asyncio.run(run()) == ["took [1]", "released", "closed"]


def test_merge_deltas_joins_each_run_of_one_kind_and_keeps_the_rest_in_place() -> None:
    start = ToolCallStart(name="f", call_id="c1")
    events = [
        ReasoningDelta("think", [1]), ReasoningDelta("ing", [2]),
        TextDelta("Hel", [3]), TextDelta("lo", [4]),
        start, ToolCallDelta('{"a":', [5]), ToolCallDelta(" 1}", [6]),
        TextDelta("!", [7]),
    ]
    assert merge_deltas(events) == [
        ReasoningDelta("thinking", [1, 2]), TextDelta("Hello", [3, 4]),
        start, ToolCallDelta('{"a": 1}', [5, 6]), TextDelta("!", [7]),
    ]
    assert merge_deltas([]) == []
