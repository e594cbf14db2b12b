#!/usr/bin/env bash
# POST /v1/generate: the native route; one NDJSON event per output, then a "finished" event.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
curl -sS -N --fail-with-body "${AUTH[@]}" "$BASE/v1/generate" -H "Content-Type: application/json" \
  -d '{"inputs": {"prompt": "Hello"}, "modalities": ["text"], "sampling": {"max_tokens": 4, "temperature": 0}}'
curl -sS -N --fail-with-body "${AUTH[@]}" "$BASE/v1/generate" -H "Content-Type: application/json" \
  -d '{"task": "speech", "inputs": {"input": "Hi"}, "audio_encoding": "pcm16"}' | cut -c1-300; echo
