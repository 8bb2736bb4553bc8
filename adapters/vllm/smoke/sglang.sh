#!/usr/bin/env bash
# GPU smoke test for the SGLang backend (needs one GPU with ~24 GB, network access to PyPI and
# Hugging Face). Installs SGLang, serves gpt-oss-20b with the cache report on, and runs an SDK
# tool loop over WebSocket through `responses-cache serve --backend sglang` (the /generate route).
# Usage: adapters/vllm/smoke/sglang.sh   (from the repository root; SGLANG_VERSION to override)
set -euo pipefail
cd "$(dirname "$0")/../../.."
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
MODEL="${MODEL:-openai/gpt-oss-20b}"
ENGINE_PORT=8200 SERVER_PORT=8201
python3 -m venv .smoke-sglang
.smoke-sglang/bin/pip install -q "sglang[all]==${SGLANG_VERSION}" -e . -e adapters/vllm openai
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_up() { for _ in $(seq 1 600); do curl -sf "$1" >/dev/null && return 0; sleep 2; done; return 1; }

.smoke-sglang/bin/python -m sglang.launch_server --model-path "$MODEL" --port $ENGINE_PORT --enable-cache-report &
pids+=($!)
wait_up "http://127.0.0.1:$ENGINE_PORT/v1/models"
cat > .smoke-sglang/serve.toml <<TOML
backend = "sglang"
renderer = "harmony"
[backend_options]
base_urls = ["http://127.0.0.1:$ENGINE_PORT"]
model = "$MODEL"
template = "harmony"
TOML
.smoke-sglang/bin/responses-cache serve --config .smoke-sglang/serve.toml --port $SERVER_PORT &
pids+=($!)
wait_up "http://127.0.0.1:$SERVER_PORT/v1/models"
.smoke-sglang/bin/python adapters/vllm/smoke/smoke_client.py "http://127.0.0.1:$SERVER_PORT/v1" "$MODEL"
