#!/usr/bin/env bash
# GPU smoke test for the vLLM adapter (needs one GPU with ~24 GB, network access to PyPI and
# Hugging Face). Installs vLLM, serves gpt-oss-20b, and runs an SDK tool loop over WebSocket
# twice: through `responses-cache serve --backend vllm`, and inside vLLM with the middleware.
# Usage: adapters/vllm/smoke/vllm.sh   (from the repository root; VLLM_VERSION to override)
set -euo pipefail
cd "$(dirname "$0")/../../.."
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
MODEL="${MODEL:-openai/gpt-oss-20b}"
ENGINE_PORT=8100 SERVER_PORT=8101 KEY=sk-smoke
python3 -m venv .smoke-vllm
.smoke-vllm/bin/pip install -q "vllm==${VLLM_VERSION}" -e . -e adapters/vllm openai
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_up() { for _ in $(seq 1 600); do curl -sf -H "Authorization: Bearer $KEY" "$1" >/dev/null && return 0; sleep 2; done; return 1; }

# 1. responses-cache in front of vLLM (tokens-in route, prompt-token details for cached counts).
.smoke-vllm/bin/vllm serve "$MODEL" --port $ENGINE_PORT --api-key $KEY --enable-scale-out --enable-prefix-caching --enable-prompt-tokens-details &
pids+=($!)
wait_up "http://127.0.0.1:$ENGINE_PORT/v1/models"
cat > .smoke-vllm/serve.toml <<TOML
backend = "vllm"
renderer = "harmony"
[backend_options]
base_urls = ["http://127.0.0.1:$ENGINE_PORT"]
model = "$MODEL"
api_key = "$KEY"
template = "harmony"
TOML
.smoke-vllm/bin/responses-cache serve --config .smoke-vllm/serve.toml --port $SERVER_PORT &
pids+=($!)
wait_up "http://127.0.0.1:$SERVER_PORT/v1/models"
.smoke-vllm/bin/python adapters/vllm/smoke/smoke_client.py "http://127.0.0.1:$SERVER_PORT/v1" "$MODEL"
cleanup; pids=()

# 2. Inside vLLM: the middleware answers WebSocket /v1/responses and generates through vLLM's engine client.
RESPONSES_CACHE_MODEL="$MODEL" VLLM_API_KEY=$KEY .smoke-vllm/bin/vllm serve "$MODEL" --port $ENGINE_PORT \
  --api-key $KEY --enable-scale-out --enable-prefix-caching --enable-prompt-tokens-details \
  --middleware responses_cache_vllm.middleware.ResponsesCacheMiddleware &
pids+=($!)
wait_up "http://127.0.0.1:$ENGINE_PORT/v1/models"
.smoke-vllm/bin/python adapters/vllm/smoke/smoke_client.py "http://127.0.0.1:$ENGINE_PORT/v1" "$MODEL" $KEY
