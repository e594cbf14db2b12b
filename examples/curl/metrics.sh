#!/usr/bin/env bash
# GET /metrics: Prometheus text (request latencies, queue, KV use, per-node batch size and step time).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
curl -sS --fail-with-body "$BASE/metrics" | grep -E '^walkserve_(requests_running|requests_waiting|kv_usage_ratio|http_responses_total)' || true
