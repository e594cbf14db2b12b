"""Fold the conductor's status snapshot (with every worker's report) into RuntimeStats."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from walkserve.entrypoint.interface import RuntimeStats


def runtime_stats(snapshot: dict[str, Any]) -> RuntimeStats:
    counters = snapshot.get("counters", {})
    nodes: dict[str, dict[str, float]] = defaultdict(lambda: {"batches": 0.0, "items": 0.0, "busy_s": 0.0})
    engines: dict[str, dict[str, float]] = {}
    kv_used = kv_total = preemptions = state = 0
    for rank, w in (snapshot.get("workers") or {}).items():
        for node, s in (w.get("nodes") or {}).items():
            for k in ("batches", "items", "busy_s"):
                nodes[node][k] += float(s.get(k, 0.0))
        for comp, e in (w.get("engines") or {}).items():
            engines[f"{comp}@rank{rank}"] = {k: float(v) for k, v in e.items() if isinstance(v, (int, float))}
            kv_used += int(e.get("kv_blocks_used", 0))
            kv_total += int(e.get("kv_blocks_total", 0))
            preemptions += int(e.get("preemptions", 0))
        state += int(w.get("walk_states", 0)) + int(w.get("engine_state", 0)) + int(w.get("inflight", 0))
        state += int(w.get("early", 0)) + int(w.get("cohort_members", 0))
    return RuntimeStats(
        running=int(snapshot.get("running", 0)),
        waiting=int(snapshot.get("waiting", 0)),
        finished=int(counters.get("finished", 0)),
        failed=int(counters.get("failed", 0)),
        aborted=int(counters.get("aborted", 0)),
        rejected=int(counters.get("rejected", 0)),
        preemptions=preemptions,
        kv_blocks_used=kv_used,
        kv_blocks_total=kv_total,
        nodes=dict(nodes),
        engines=engines,
        requests_with_state=state,
    )
