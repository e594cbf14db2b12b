"""Fold the conductor's status snapshot (with every worker's report) into RuntimeStats."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from walkserve.entrypoint.interface import RuntimeStats

RANK_GAUGES = ("walk_states", "requests", "engine_state", "inflight", "cohort_members", "early")


def _numbers(values: dict) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float))}


def _per_rank(stats: RuntimeStats, rank: int, w: dict[str, Any]) -> None:
    """One worker's report, kept apart from the others (per node and rank, per component and rank, per peer)."""
    for node, s in (w.get("nodes") or {}).items():
        stats.node_ranks[(node, rank)] = _numbers(s)
    for comp, e in (w.get("engines") or {}).items():
        stats.engine_ranks[(comp, rank)] = _numbers(e)
    stats.rank_gauges[rank] = {k: float(w.get(k, 0)) for k in RANK_GAUGES}
    for peer, sent in (w.get("sent_to") or {}).items():
        stats.transfers[(rank, int(peer))] = _numbers(sent)


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
            engines[f"{comp}@rank{rank}"] = _numbers(e)
            kv_used += int(e.get("kv_blocks_used", 0))
            kv_total += int(e.get("kv_blocks_total", 0))
            preemptions += int(e.get("preemptions", 0))
        state += int(w.get("walk_states", 0)) + int(w.get("engine_state", 0)) + int(w.get("inflight", 0))
        state += int(w.get("early", 0)) + int(w.get("cohort_members", 0))
    stats = RuntimeStats(
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
    for rank, w in (snapshot.get("workers") or {}).items():
        _per_rank(stats, int(rank), w)
    return stats
