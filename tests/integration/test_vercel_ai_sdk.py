"""The Vercel AI SDK's multi-turn ``generateText`` and ``streamText`` (HTTP, ``store: true``).

The SDK (``ai`` and ``@ai-sdk/openai``, pinned) comes from the npm registry and is cached under
``~/.cache/responses-cache``; the test is skipped only where Node.js/npm is missing. Its ordinary
pattern, ``messages: [...history, ...result.response.messages, next]``, sends earlier output back
as ``item_reference`` items; the backend must receive the referenced items themselves.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from responses_cache import SimulatedConfig, SimulatedEngine
from responses_cache.protocol.items import Message, text_of
from responses_cache.testing import RecordingBackend

AI_VERSION = "7.0.173"
OPENAI_PROVIDER_VERSION = "4.0.118"
SCRIPT = Path(__file__).with_name("vercel_ai") / "multiturn.mjs"


@pytest.fixture(scope="session")
def vercel_ai_dir() -> Path:
    """A folder with the SDK installed, where the script is run from (ESM resolves from there)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js/npm is not installed: cannot run the Vercel AI SDK")
    prefix = Path.home() / ".cache" / "responses-cache" / f"vercel-ai-{AI_VERSION}-{OPENAI_PROVIDER_VERSION}"
    if not (prefix / "node_modules" / "@ai-sdk" / "openai" / "package.json").exists():
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix),
             f"ai@{AI_VERSION}", f"@ai-sdk/openai@{OPENAI_PROVIDER_VERSION}"],
            check=True, timeout=600, stdin=subprocess.DEVNULL,
        )
    shutil.copyfile(SCRIPT, prefix / SCRIPT.name)
    return prefix


def assistant_texts(request: Any) -> list[str]:
    return [text_of(i.content) for i in request.conversation.items() if isinstance(i, Message) and i.role == "assistant"]


def test_multi_turn_generate_and_stream_text_with_store(vercel_ai_dir: Path, responses_cache_server_factory: Any) -> None:
    backend = RecordingBackend(SimulatedEngine(SimulatedConfig(instant=True)))
    server = responses_cache_server_factory(backend=backend)
    done = subprocess.run(
        ["node", SCRIPT.name, server.http_url],
        cwd=vercel_ai_dir, env={"PATH": os.environ["PATH"], "HOME": str(vercel_ai_dir)},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["error"] is None, report["error"]

    for texts, first, again, last in (
        (report["generate"], "Say hello", "Again", "And once more"),
        (report["stream"], "Stream hello", "Stream again", "Stream once more"),
    ):
        assert texts[0].startswith(f"Simulated answer to: {first}.")
        assert texts[1].startswith(f"Simulated answer to: {again}.")
        assert texts[2] == "The command finished. Last line of its output: hello-from-the-tool"
        assert texts[3].startswith(f"Simulated answer to: {last}.")

    # The SDK did send references (store defaults to true), on both entry points…
    bodies = report["bodies"]
    refs = [b for b in bodies if any(i.get("type") == "item_reference" for i in b["input"])]
    assert any(b.get("stream") for b in refs) and any(not b.get("stream") for b in refs)
    assert all(b.get("store", True) for b in bodies)
    # …and the engine received the referenced answers themselves, in order.
    assert len(backend.requests) == len(bodies)
    final_generate = next(r for r in backend.requests if assistant_texts(r) and "And once more" in text_of_last_user(r))
    assert assistant_texts(final_generate) == report["generate"][:3]
    final_stream = next(r for r in backend.requests if "Stream once more" in text_of_last_user(r))
    assert assistant_texts(final_stream) == report["stream"][:3]


def text_of_last_user(request: Any) -> str:
    users = [i for i in request.conversation.items() if isinstance(i, Message) and i.role == "user"]
    return text_of(users[-1].content) if users else ""
