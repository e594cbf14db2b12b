#!/usr/bin/env bash
# GET /health (200 when ready, 503 while starting or draining) and GET /v1/models.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
curl -sS "$BASE/health"; echo
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/models"; echo
