#!/usr/bin/env bash
# POST /v1/audio/speech: a WAV file, a FLAC file, raw PCM streamed as produced, and OpenAI's SSE events.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
OUT="${2:-$(mktemp -d)}"
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/audio/speech" -H "Content-Type: application/json" \
  -d '{"input": "Hello from walkserve.", "response_format": "wav"}' -o "$OUT/speech.wav"
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/audio/speech" -H "Content-Type: application/json" \
  -d '{"input": "Hello from walkserve.", "response_format": "flac"}' -o "$OUT/speech.flac"
curl -sS -N --fail-with-body "${AUTH[@]}" "$BASE/v1/audio/speech" -H "Content-Type: application/json" \
  -d '{"input": "Hello from walkserve.", "response_format": "pcm", "stream_format": "audio"}' -o "$OUT/speech.pcm"
curl -sS -N --fail-with-body "${AUTH[@]}" "$BASE/v1/audio/speech" -H "Content-Type: application/json" \
  -d '{"input": "Hi.", "response_format": "pcm", "stream_format": "sse"}' | tail -c 200; echo
ls -l "$OUT"
