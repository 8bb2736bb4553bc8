"""``RecordingBackend`` wraps any backend: it records the requests and leaves the rest to it."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import httpx

from responses_cache import create_app
from responses_cache.backends.base import BackendEvent, GenerationRequest, PreflightBackend
from responses_cache.backends.simulated import SimulatedConfig, SimulatedEngine
from responses_cache.testing import RecordingBackend


class Adapter:
    """A backend with a lifecycle, a context window and a preflight, as the real adapters have."""

    accepts_media = False
    context_window = 1234

    def __init__(self) -> None:
        self.inner = SimulatedEngine(SimulatedConfig(instant=True))
        self.calls: list[str] = []

    def models(self) -> list[str]:
        return self.inner.models()

    async def start(self) -> None:
        self.calls.append("start")

    async def aclose(self) -> None:
        self.calls.append("aclose")

    def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self.calls.append("generate")
        return self.inner.generate(request)

    async def open_stream(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        self.calls.append("open_stream")
        return self.inner.generate(request)


def test_a_wrapped_adapter_starts_streams_and_closes_as_alone(responses_cache_server_factory: Any) -> None:
    adapter = Adapter()
    recorder = RecordingBackend(adapter)
    assert isinstance(recorder, PreflightBackend) and not recorder.accepts_media and recorder.context_window == 1234
    server = responses_cache_server_factory(create_app(backend=recorder))
    answer = httpx.post(server.http_url + "/responses", json={"model": "sim-1", "input": "hi"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert adapter.calls[:2] == ["start", "open_stream"] and len(recorder.requests) == 1
    server.stop()
    assert adapter.calls[-1] == "aclose"


def test_a_backend_without_a_preflight_is_not_given_one() -> None:
    recorder = RecordingBackend(SimulatedEngine(SimulatedConfig(instant=True)))
    assert not isinstance(recorder, PreflightBackend) and recorder.accepts_media
    assert getattr(recorder, "start", None) is None
