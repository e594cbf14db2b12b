# Sourced by every curl example: BASE (first argument, default http://127.0.0.1:8000) and AUTH (from $WALKSERVE_API_KEY).
BASE="${1:-http://127.0.0.1:8000}"
AUTH=()
if [ -n "${WALKSERVE_API_KEY:-}" ]; then AUTH=(-H "Authorization: Bearer ${WALKSERVE_API_KEY}"); fi
