#!/usr/bin/env bash
# Start the reference server and run one Codex CLI task through it over WebSocket mode.
# Needs Node.js (npm) for the Codex CLI; everything stays on 127.0.0.1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$work"' EXIT
[ -x "$work/node_modules/.bin/codex" ] || npm install --silent --prefix "$work" @openai/codex@0.171.0
responses-cache serve --backend simulated --port 8000 & server=$!
sleep 2
mkdir -p "$work/home" && cp "$here/config.toml" "$work/home/config.toml"
cd "$work" && CODEX_HOME="$work/home" "$work/node_modules/.bin/codex" exec --skip-git-repo-check --ephemeral \
  'Run `echo hello-from-codex` and tell me the output.' </dev/null
