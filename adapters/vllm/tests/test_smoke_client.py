"""The GPU smoke client, run on CPU against the fake vLLM behind the real server: the official
``openai`` SDK drives a tool loop over WebSocket mode and cached tokens grow from turn 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from responses_cache import create_app, get_renderer
from responses_cache.backends import load_backend
from responses_cache.testing import Behaviour, FakeVllm

ENC = get_renderer("harmony").encoding
SMOKE = Path(__file__).resolve().parents[1] / "smoke" / "smoke_client.py"


def _call(cmd: str) -> str:
    return ("<|channel|>analysis<|message|>Next step.<|end|><|start|>assistant<|channel|>commentary "
            f"to=functions.exec_command <|constrain|>json<|message|>{json.dumps({'cmd': cmd})}<|call|>")


def test_smoke_client_tool_loop_against_the_fake(responses_cache_server_factory: Any, capsys: Any) -> None:
    engine = FakeVllm(ENC, [_call("ls"), _call("cat README.md"), _call("git log -1"),
                            "<|channel|>final<|message|>A small demo project.<|return|>"])
    engine.default = Behaviour(chunk_tokens=4, hold_back=True)
    upstream = responses_cache_server_factory(engine.app())
    backend = load_backend("vllm", base_urls=f"http://127.0.0.1:{upstream.port}", model=engine.model, template="harmony")
    server = responses_cache_server_factory(create_app(backend=backend, renderer="harmony"))
    spec = importlib.util.spec_from_file_location("smoke_client", SMOKE)
    assert spec is not None and spec.loader is not None
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    assert smoke.main(server.http_url, engine.model) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["ok"] is True and summary["turns"] == 4
    assert summary["cached_tokens"][0] == 0 and all(c > 0 for c in summary["cached_tokens"][1:])
    assert len(engine.generation_requests()) == 4 and engine.unknown_fields == []
