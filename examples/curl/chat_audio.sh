#!/usr/bin/env bash
# Spoken chat output (models with the audio_out capability): modalities text+audio; streamed audio is pcm16.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/chat/completions" -H "Content-Type: application/json" \
  -d '{"messages": [{"role": "user", "content": "Greet me"}], "modalities": ["text", "audio"], "audio": {"format": "wav"}, "max_tokens": 16}' \
  | cut -c1-300; echo
curl -sS -N --fail-with-body "${AUTH[@]}" "$BASE/v1/chat/completions" -H "Content-Type: application/json" \
  -d '{"messages": [{"role": "user", "content": "Greet me"}], "modalities": ["text", "audio"], "audio": {"format": "pcm16"}, "max_tokens": 8, "stream": true}' \
  | cut -c1-300; echo
