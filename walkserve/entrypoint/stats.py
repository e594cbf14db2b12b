"""Fold the conductor's status snapshot (with every worker's report) into RuntimeStats."""

from __future__ import annotations

from collections import defaultdict

from walkserve.entrypoint.interface import RuntimeStats
from walkserve.protocol.rank_stats import RankStats, RuntimeSnapshot

RANK_GAUGES = ("walk_states", "requests", "engine_state", "inflight", "cohort_members", "early")


def _numbers(values: dict) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float))}


def _per_rank(stats: RuntimeStats, rank: int, w: RankStats) -> None:
    """One worker's report, kept apart from the others (per node and rank, per component and rank, per peer)."""
    for node, s in w.nodes.items():
        stats.node_ranks[(node, rank)] = _numbers(s)
    for comp, e in w.engines.items():
        stats.engine_ranks[(comp, rank)] = _numbers(e)
    stats.rank_gauges[rank] = {k: float(getattr(w, k)) for k in RANK_GAUGES}
    for peer, sent in w.sent_to.items():
        stats.transfers[(rank, peer)] = _numbers(sent)
    for node, counts in w.slack.items():
        stats.slack[(node, rank)] = list(counts)
    stats.rank_streams[rank] = {**_numbers(w.scheduling), "gap_s": w.gap_s}


def runtime_stats(snapshot: RuntimeSnapshot) -> RuntimeStats:
    counters = snapshot.counters
    nodes: dict[str, dict[str, float]] = defaultdict(lambda: {"batches": 0.0, "items": 0.0, "busy_s": 0.0})
    engines: dict[str, dict[str, float]] = {}
    kv_used = kv_total = preemptions = state = 0
    for rank, w in snapshot.workers.items():
        for node, s in w.nodes.items():
            for k in ("batches", "items", "busy_s"):
                nodes[node][k] += float(s.get(k, 0.0))
        for comp, e in w.engines.items():
            engines[f"{comp}@rank{rank}"] = _numbers(e)
            kv_used += int(e.get("kv_blocks_used", 0))
            kv_total += int(e.get("kv_blocks_total", 0))
            preemptions += int(e.get("preemptions", 0))
        state += w.walk_states + w.engine_state + w.inflight + w.early + w.cohort_members
    stats = RuntimeStats(
        running=snapshot.running,
        waiting=snapshot.waiting,
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
        streams={**snapshot.streams, "admitted": float(counters.get("streams_admitted", 0)),
                 "rejected_capacity": float(counters.get("streams_rejected_capacity", 0))},
    )
    for rank, w in snapshot.workers.items():
        _per_rank(stats, rank, w)
    return stats
