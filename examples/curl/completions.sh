#!/usr/bin/env bash
# POST /v1/completions: a text prompt, then the same prompt streamed (SSE).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/completions" -H "Content-Type: application/json" \
  -d '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}'; echo
curl -sS -N --fail-with-body "${AUTH[@]}" "$BASE/v1/completions" -H "Content-Type: application/json" \
  -d '{"prompt": "Once upon a time", "max_tokens": 8, "stream": true}'
