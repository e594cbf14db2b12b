#!/usr/bin/env bash
# POST /v1/images/generations (JSON) and /v1/images/edits (multipart), for models with image capabilities.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/images/generations" -H "Content-Type: application/json" \
  -d '{"prompt": "a lighthouse at dusk", "size": "64x64", "n": 1, "response_format": "b64_json"}' | cut -c1-300; echo
TMP="$(mktemp -d)"
echo "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGM8ESDHwMDAxMDAwMDAAAAPXAE6Lne0BgAAAABJRU5ErkJggg==" | base64 -d > "$TMP/in.png"
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/images/edits" -F "image=@$TMP/in.png;type=image/png" -F "prompt=make it blue" \
  | cut -c1-300; echo
