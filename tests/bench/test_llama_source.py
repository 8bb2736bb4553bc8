"""The llama.cpp source archive for a machine with no registry (``llamaproc.pack_source``): what
the server's build and the GGUF converter need, without the build, models, docs, tests or the other
accelerators' backends, and what ``provision(source=...)`` extracts."""

from __future__ import annotations

import tarfile
from pathlib import Path

from benchmarks.suite import llamaproc


def test_the_packed_source_keeps_the_server_and_cuda_and_leaves_the_rest(tmp_path: Path) -> None:
    build = llamaproc.Build(tmp_path / "home")
    files = ["CMakeLists.txt", "convert_hf_to_gguf.py", "gguf-py/gguf/__init__.py", "src/llama.cpp",
             "tools/server/server.cpp", "ggml/src/ggml-cuda/mmq.cu", "ggml/src/ggml-cpu/ggml-cpu.c",
             "ggml/include/ggml-vulkan.h", "build/bin/llama-server", "models/ggml-vocab-qwen2.gguf",
             "docs/build.md", "tests/test-tokenizer.cpp", "ggml/src/ggml-vulkan/ggml-vulkan.cpp",
             "ggml/src/ggml-metal/ggml-metal.m"]
    for name in files:
        path = build.source / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
    archive = llamaproc.pack_source(build, tmp_path / "src.tar.xz")
    with tarfile.open(archive) as packed:
        names = {m.name for m in packed.getmembers() if m.isfile()}
    assert names == {
        "CMakeLists.txt", "convert_hf_to_gguf.py", "gguf-py/gguf/__init__.py", "src/llama.cpp",
        "tools/server/server.cpp", "ggml/src/ggml-cuda/mmq.cu", "ggml/src/ggml-cpu/ggml-cpu.c",
        "ggml/include/ggml-vulkan.h",  # a header the build includes whatever the backend
    }
    # What provision(source=...) unpacks is the tree, at the paths the build expects.
    out = tmp_path / "unpacked"
    llamaproc.unpack_source(archive, out)
    assert (out / "tools/server/server.cpp").read_text() == "tools/server/server.cpp"
