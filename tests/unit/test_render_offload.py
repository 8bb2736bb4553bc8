"""No request may stall the others: input that cannot fit is refused before it is tokenized, and
large tokenizations run on a worker thread, off the event loop. Checked by counting work and by
where it ran, never by timing."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from responses_cache import SimulatedConfig, SimulatedEngine, create_app
from responses_cache.observability.metrics import InMemoryMetrics
from responses_cache.tokens import get_renderer
from responses_cache.tokens.base import longest_token_within, max_token_bytes


def _app(window: int, **options: Any) -> tuple[Any, Any, list[str]]:
    renderer = get_renderer("harmony")
    threads: list[str] = []
    for name in ("render_full", "extend"):
        original = getattr(renderer, name)

        def spy(*args: Any, _original: Any = original, **kw: Any) -> Any:
            threads.append(threading.current_thread().name)
            return _original(*args, **kw)

        setattr(renderer, name, spy)
    from responses_cache.backends.routing import Route, StaticRouter

    engine = SimulatedEngine(SimulatedConfig(instant=True, answer_tokens=2))
    route = Route("default", "sim-1", engine, renderer, context_window=window)
    app = create_app(router=StaticRouter({"sim-1": route}, default=route), metrics=InMemoryMetrics(), **options)
    return app, renderer, threads


async def _post(app: Any, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t/v1") as c:
        return await c.post("/responses", json=body)


def test_the_longest_token_bounds_the_token_count() -> None:
    encoding = get_renderer("harmony").encoding
    longest = max_token_bytes(encoding)
    assert longest == max(len(b) for b in encoding.token_byte_values())
    text = "a" * 100_000
    assert len(encoding.encode_ordinary(text)) >= len(text.encode()) // longest


async def test_input_that_cannot_fit_is_refused_without_tokenizing() -> None:
    app, renderer, threads = _app(window=1_000)
    too_long = "a" * (1_000 * max_token_bytes(renderer.encoding) + 1_000)
    before = renderer.stats.tokens_encoded
    response = await _post(app, {"model": "sim-1", "input": too_long})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "at least" in error["message"]
    assert renderer.stats.tokens_encoded == before and threads == []  # nothing was tokenized


async def test_large_renders_run_off_the_event_loop() -> None:
    app, _, threads = _app(window=1_000_000)
    app.state.service.core.pipeline.offload_chars = 10_000
    small = await _post(app, {"model": "sim-1", "input": "hello"})
    assert small.status_code == 200
    assert set(threads) == {threading.current_thread().name}  # small: rendered inline
    calls = len(threads)
    big = await _post(app, {"model": "sim-1", "input": "hello world " * 2_000})
    assert big.status_code == 200
    # the prompt was rendered on a worker; the short output is appended inline
    assert threads[calls].startswith("responses-cache-render")
    assert app.state.metrics.total("renders_offloaded_total", transport="http") == 1
    app.state.service.core.pipeline.close()


@pytest.mark.parametrize("window", [100])
async def test_an_error_raised_on_the_worker_thread_is_the_envelope(window: int) -> None:
    app, _, threads = _app(window=window)
    app.state.service.core.pipeline.offload_chars = 1
    response = await _post(app, {"model": "sim-1", "input": "hello " * 200})
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert threads and threads[-1].startswith("responses-cache-render")
    app.state.service.core.pipeline.close()


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("ab ="), min_size=1, max_size=3_000) | st.text(min_size=1, max_size=500))
def test_the_byte_bound_never_exceeds_the_real_token_count(text: str) -> None:
    encoding = get_renderer("harmony").encoding
    data = text.encode("utf-8", "surrogatepass")
    try:
        real = len(encoding.encode_ordinary(text))
    except ValueError:  # tiktoken refuses lone surrogates; the server never sees them (invalid JSON)
        return
    assert len(data) // longest_token_within(encoding, data) <= real
    assert len(data) // max_token_bytes(encoding) <= real


async def test_a_huge_low_diversity_input_is_refused_without_tokenizing() -> None:
    app, renderer, threads = _app(window=1_000)
    before = renderer.stats.tokens_encoded
    # 9,000 characters: under window x 128 (the vocabulary-wide floor lets it through), but a
    # run of one letter cannot use tokens longer than that letter's longest run in the vocabulary.
    response = await _post(app, {"model": "sim-1", "input": "a" * 9_000})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "at least" in error["message"]
    assert renderer.stats.tokens_encoded == before and threads == []
    fits = await _post(app, {"model": "sim-1", "input": "a" * 3_000})  # under window x 4: tokenized
    assert fits.status_code == 200
