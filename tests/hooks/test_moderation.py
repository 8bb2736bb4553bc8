"""``ModerationHook`` against a real moderation HTTP service on loopback (starlette in uvicorn):
flagging, only new texts sent, timeouts and errors with fail-open and fail-closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from responses_cache.protocol.items import FunctionCallOutput, Message
from responses_cache.safety import ModerationHook
from responses_cache.testing import TEST_CONTEXT, run_turns


class ModerationService:
    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    async def moderate(self, request: Request) -> Response:
        texts = (await request.json())["input"]
        self.seen.append(texts)
        return JSONResponse(
            {"results": [{"flagged": "BADWORD" in t, "categories": {}} for t in texts]}
        )

    async def simple(self, request: Request) -> Response:
        texts = (await request.json())["input"]
        return JSONResponse({"flagged": any("BADWORD" in t for t in texts)})

    async def slow(self, request: Request) -> Response:
        await asyncio.sleep(2)
        return JSONResponse({"flagged": False})

    async def broken(self, request: Request) -> Response:
        return Response("oops", status_code=500)

    async def garbage(self, request: Request) -> Response:
        return JSONResponse({"unexpected": True})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/moderations", self.moderate, methods=["POST"]),
                Route("/simple", self.simple, methods=["POST"]),
                Route("/slow", self.slow, methods=["POST"]),
                Route("/broken", self.broken, methods=["POST"]),
                Route("/garbage", self.garbage, methods=["POST"]),
            ]
        )


@pytest.fixture
async def keep() -> AsyncIterator[Callable[[ModerationHook], ModerationHook]]:
    """Hooks made by a test, closed at its end (a hook keeps its HTTP client for reuse)."""
    made: list[ModerationHook] = []

    def track(hook: ModerationHook) -> ModerationHook:
        made.append(hook)
        return hook

    yield track
    for hook in made:
        await hook.aclose()


@pytest.fixture
def moderation(responses_cache_server_factory: Any) -> Iterator[tuple[ModerationService, str]]:
    service = ModerationService()
    server = responses_cache_server_factory(service.app())
    yield service, f"http://{server.host}:{server.port}"


async def test_flags_and_sends_only_new_texts(moderation: tuple[ModerationService, str], keep: Any) -> None:
    service, base = moderation
    hook = keep(ModerationHook(f"{base}/v1/moderations", timeout=2))
    v1 = await hook(
        TEST_CONTEXT,
        [Message(role="user", content="hello"), Message(role="assistant", content="x")],
        None,
    )
    assert not v1.flagged
    v2 = await hook(
        TEST_CONTEXT, [FunctionCallOutput(call_id="c", output="BADWORD inside")], v1.state
    )
    assert v2.flagged and v2.code == "content_filter"
    assert service.seen == [["hello"], ["BADWORD inside"]]  # assistant text is out of scope
    assert hook.bytes_scanned == len("hello") + len("BADWORD inside") and hook.calls == 2
    # No in-scope text: no call.
    await hook(TEST_CONTEXT, [Message(role="assistant", content="BADWORD")], v1.state)
    assert hook.calls == 2


async def test_simple_answer_shape(moderation: tuple[ModerationService, str], keep: Any) -> None:
    _, base = moderation
    hook = keep(ModerationHook(f"{base}/simple"))
    assert (await hook(TEST_CONTEXT, [Message(role="user", content="BADWORD")], None)).flagged
    assert not (await hook(TEST_CONTEXT, [Message(role="user", content="fine")], None)).flagged


@pytest.mark.parametrize("path", ["/slow", "/broken", "/garbage", "/missing"])
async def test_fail_open(moderation: tuple[ModerationService, str], path: str, keep: Any) -> None:
    _, base = moderation
    hook = keep(ModerationHook(f"{base}{path}", timeout=0.2, fail_open=True))
    v = await hook(TEST_CONTEXT, [Message(role="user", content="BADWORD")], None)
    # Not flagged although the text is bad: the hook gave up (for /slow: its 0.2 s timeout, before
    # the service's 2 s answer would have flagged it) and let the turn through.
    assert not v.flagged and hook.failures == 1


@pytest.mark.parametrize("path", ["/slow", "/broken", "/garbage"])
async def test_fail_closed(moderation: tuple[ModerationService, str], path: str, keep: Any) -> None:
    _, base = moderation
    hook = keep(ModerationHook(f"{base}{path}", timeout=0.2, fail_open=False))
    v = await hook(TEST_CONTEXT, [Message(role="user", content="anything")], None)
    assert v.flagged and v.code == "moderation_unavailable" and hook.failures == 1


async def test_unreachable_service_fail_closed(keep: Any) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hook = keep(ModerationHook(f"http://127.0.0.1:{port}/v1/moderations", timeout=0.5, fail_open=False))
    v = await hook(TEST_CONTEXT, [Message(role="user", content="x")], None)
    assert v.flagged and v.code == "moderation_unavailable"


async def test_in_the_pipeline(moderation: tuple[ModerationService, str], keep: Any) -> None:
    """Blocking turns through the pipeline (no sockets on the server side)."""
    from responses_cache import create_app

    service, base = moderation
    hook = keep(ModerationHook(f"{base}/v1/moderations", timeout=2))
    app = create_app(hooks=[hook], renderer=None)
    results = await run_turns(app, ["hello", "BADWORD please", "ok then"])
    assert results[0].types[-1] == "response.completed"
    assert (
        results[1].error is not None
        and results[1].error.code == "content_filter"
        and results[1].events == []
    )
    assert results[2].types[-1] == "response.completed"
    assert service.seen == [["hello"], ["BADWORD please"], ["ok then"]]


def test_httpx_is_imported_lazily() -> None:
    import subprocess
    import sys

    code = "import sys, responses_cache.safety; print('httpx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out
    assert httpx  # used by the tests above through the hook
