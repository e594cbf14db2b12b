#!/usr/bin/env bash
# POST /v1/chat/completions with an image_url content part (a data: URL; remote URLs need --media-allowlist).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
PNG="iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGM8ESDHwMDAxMDAwMDAAAAPXAE6Lne0BgAAAABJRU5ErkJggg=="
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/chat/completions" -H "Content-Type: application/json" -d @- <<JSON
{"messages": [{"role": "user", "content": [
  {"type": "text", "text": "What is in this picture?"},
  {"type": "image_url", "image_url": {"url": "data:image/png;base64,$PNG"}}]}],
 "max_tokens": 16}
JSON
echo
