"""The llama.cpp real-engine suite: a real ``llama-server`` (built from source once into the engine
cache, ``benchmarks/suite/llamaproc.py``) serving tiny random-weight GGUF models converted at test
time from the suite's tiny Hugging Face models: a Qwen-style one (Qwen3's real tokenizer files and
chat template, ChatML) and a DeepSeek-style one (DeepSeek's real vocabulary and its template, not
ChatML). No weights are downloaded.

One server per family for the whole session (each starts in about a second): two slots of
:data:`~llama_suite.CONTEXT` tokens (Codex's first prompt is ~9k), prompt caching, ``/slots`` and
``/metrics``. The build is skipped only where it is
impossible (no cmake, ninja or C++ compiler).
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from llama_suite import CONTEXT, FAMILIES, Family

from benchmarks.suite import llamaproc, vllmproc
from tests.tokens.hf_assets import available, build_tokenizer_dir, real_model_dir


@pytest.fixture(scope="session")
def llama_build() -> llamaproc.Build:
    missing = [tool for tool in ("cmake", "ninja", "c++") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"building llama-server needs {', '.join(missing)}")
    return llamaproc.provision()


def _tokenizer_files(family: str, root: pathlib.Path) -> pathlib.Path | None:
    if family.endswith("-real"):
        return real_model_dir(family.removesuffix("-real"))
    return build_tokenizer_dir(family, root / family) if available(family) else None


@pytest.fixture(scope="session")
def llama_models(llama_build: llamaproc.Build) -> dict[str, tuple[pathlib.Path, pathlib.Path]]:
    """Family -> (its tiny Hugging Face model directory, the GGUF converted from it)."""
    python = vllmproc.provision()  # torch and transformers for convert_hf_to_gguf.py
    with tempfile.TemporaryDirectory(prefix="llama-families-") as root:
        found = {f: d for f in FAMILIES if (d := _tokenizer_files(f, pathlib.Path(root))) is not None}
        built = vllmproc.hf_models(python, {f"tiny-{f}": (found[f], FAMILIES[f]) for f in found})
    return {f: (built[f"tiny-{f}"], llamaproc.gguf_model(llama_build, python, built[f"tiny-{f}"], f"tiny-{f}"))
            for f in found}


@pytest.fixture(scope="session")
def llama_servers(
    llama_build: llamaproc.Build, llama_models: dict[str, tuple[pathlib.Path, pathlib.Path]]
) -> Iterator[dict[str, Family]]:
    # --no-prefill-assistant: /apply-template (the oracle) then renders a conversation that ends
    # with an assistant message and the generation prompt, as a prompt for a new answer (by default
    # it would leave that message open, for the model to continue it). /completion is unaffected.
    servers = {f: llamaproc.LlamaServer(llama_build, gguf, alias=f, slots=2, context=CONTEXT,
                                        extra_args=["--no-prefill-assistant"])
               for f, (_, gguf) in llama_models.items()}
    try:
        for server in servers.values():
            server.launch()
        for server in servers.values():
            server.wait_ready()
        yield {f: Family(f, *llama_models[f], servers[f]) for f in servers}
    finally:
        for server in servers.values():
            server.close()


@pytest.fixture(scope="session", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, llama_servers: dict[str, Family]) -> Family:
    name = str(request.param)
    if name not in llama_servers:
        pytest.skip(f"the {name} tokenizer files cannot be had here (npm or a vocabulary package missing)")
    return llama_servers[name]


@pytest.fixture
def qwen(llama_servers: dict[str, Family]) -> Family:
    if "qwen3-real" not in llama_servers:
        pytest.skip("Qwen3's tokenizer files cannot be had here (npm missing)")
    return llama_servers["qwen3-real"]
