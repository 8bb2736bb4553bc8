"""``responses-cache serve`` in its own process, over an instant simulated engine that appends
what it is given (``context_of`` each request, as JSON lines) to ``$RECORD_PATH``.

Run as ``python recording_serve.py serve --port P --store redis://...``: everything but the
backend is the real command."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncGenerator
from typing import Any

import msgspec

import responses_cache.backends as backends
from responses_cache.backends.base import BackendEvent, GenerationRequest
from responses_cache.server.cli import main
from responses_cache.testing import RecordingBackend, context_of


class FileRecorder(RecordingBackend):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[BackendEvent, None]:
        with open(self.path, "ab") as out:
            out.write(msgspec.json.encode({"response_id": request.response_id, **context_of(request)}) + b"\n")
        async for event in super().generate(request):
            yield event


def _load(name: str, **options: Any) -> Any:
    return FileRecorder(os.environ["RECORD_PATH"])


backends.load_backend = _load  # what `serve` calls to build its backend

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
