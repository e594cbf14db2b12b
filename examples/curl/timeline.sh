#!/usr/bin/env bash
# GET /v1/requests/{id}/timeline: one speech request, then its timeline (Chrome/Perfetto trace-event JSON),
# found by the X-Request-Id header of the answer. Open the file in https://ui.perfetto.dev.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
OUT="${2:-$(mktemp -d)}"
ID=$(curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/audio/speech" -H "Content-Type: application/json" \
  -d '{"input": "Hello from walkserve.", "response_format": "wav"}' -o "$OUT/speech.wav" -D - \
  | tr -d '\r' | awk -F': ' 'tolower($1) == "x-request-id" {print $2}')
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/requests/$ID/timeline" -o "$OUT/timeline-$ID.json"
echo "request $ID: $(grep -o '"ph":"X"' "$OUT/timeline-$ID.json" | wc -l) events in $OUT/timeline-$ID.json"
