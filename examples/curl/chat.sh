#!/usr/bin/env bash
# POST /v1/chat/completions: one answer, then a stream with a final usage chunk.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/chat/completions" -H "Content-Type: application/json" \
  -d '{"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 32, "seed": 1}'; echo
curl -sS -N --fail-with-body "${AUTH[@]}" "$BASE/v1/chat/completions" -H "Content-Type: application/json" \
  -d '{"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8, "stream": true, "stream_options": {"include_usage": true}}'
