"""Per node, rank, peer and KV pool metric families, built from one RuntimeStats at scrape time.

Labels are bounded by the placement: ``node`` (a graph node), ``component`` (an engine), ``rank`` and
``peer`` (ranks). Nothing is labelled per request. Rates are the dashboard's job: a node's busy
fraction is ``rate(walkserve_node_rank_busy_seconds_total[1m])``, its mean step time
``rate(busy_seconds) / rate(batches)``, its mean batch ``rate(items) / rate(batches)``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from walkserve.entrypoint.interface import RuntimeStats

NODE_COUNTERS = (  # (family, RankStats.nodes key, help)
    ("walkserve_node_rank_batches", "batches", "Batches (engine steps) a node ran on a rank."),
    ("walkserve_node_rank_items", "items", "Items (firings) a node processed on a rank."),
    ("walkserve_node_rank_busy_seconds", "busy_s", "Seconds a node's engine was busy on a rank; its rate is the busy fraction."),
)
RANK_GAUGES = (  # (family, rank gauge key, help)
    ("walkserve_rank_queue_depth", "inflight", "Firings queued or running in a rank's engines."),
    ("walkserve_rank_requests", "requests", "Requests a rank holds state for."),
    ("walkserve_rank_cohort_members", "cohort_members", "Loop members stepping in a rank's cohorts."),
)
TRANSFER_COUNTERS = (  # (family, key, help)
    ("walkserve_transfer_messages", "messages", "Messages a rank sent to a peer rank."),
    ("walkserve_transfer_tensors", "tensors", "Tensors (chunks) a rank sent to a peer rank."),
    ("walkserve_transfer_bytes", "bytes", "Tensor bytes a rank sent to a peer rank (shared memory or inline)."),
    ("walkserve_transfer_seconds", "seconds", "Seconds a rank spent packing, encoding and sending to a peer rank."),
    ("walkserve_transfer_frames", "frames", "Frames (one per flush: all messages of a heartbeat) a rank sent to a peer."),
    ("walkserve_transfer_direct_frames", "direct_frames",
     "Of those frames, the ones sent over the node's datagram socket rather than ZeroMQ."),
)
KV_GAUGES = (
    ("walkserve_kv_pool_blocks_used", "kv_blocks_used", "KV blocks in use, per pool (component and rank)."),
    ("walkserve_kv_pool_blocks_cached", "kv_blocks_cached", "Free KV blocks still holding a reusable prefix."),
    ("walkserve_kv_pool_running", "running", "Sequences the pool's scheduler runs."),
    ("walkserve_kv_pool_waiting", "waiting", "Sequences waiting in the pool's scheduler (its queue depth)."),
    ("walkserve_kv_pool_capture_cache_bytes", "capture_cache_bytes",
     "Bytes of captured rows the pool's capture cache keeps for later prompt pieces."),
)
KV_COUNTERS = (
    ("walkserve_kv_pool_prefix_hit_tokens", "prefix_hit_tokens", "Prompt tokens served from the prefix cache."),
    ("walkserve_kv_pool_prefill_tokens", "prefill_tokens",
     "Prompt tokens computed (rows of firings longer than one row, recomputation after preemption included)."),
    ("walkserve_kv_pool_preemptions", "preemptions", "Sequences preempted for KV space."),
    ("walkserve_kv_pool_capture_cache_hits", "capture_cache_hits",
     "Prompt pieces answered from the capture cache (their captured rows kept from an equal earlier piece)."),
    ("walkserve_kv_pool_capture_cache_partial_hits", "capture_cache_partial_hits",
     "Prompt pieces whose first runs (encoder windows) came from the capture cache, only the rest computed."),
)


def graph_families(stats: RuntimeStats) -> Iterator[Metric]:
    yield from _nodes(stats)
    yield from _ranks(stats)
    yield from _transfers(stats)
    yield from _kv_pools(stats)


def _nodes(stats: RuntimeStats) -> Iterator[Metric]:
    for name, key, doc in NODE_COUNTERS:
        family = CounterMetricFamily(name, doc, labels=["node", "rank"])
        for (node, rank), values in sorted(stats.node_ranks.items()):
            family.add_metric([node, str(rank)], values.get(key, 0.0))
        yield family


def _ranks(stats: RuntimeStats) -> Iterator[Metric]:
    for name, key, doc in RANK_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=["rank"])
        for rank, values in sorted(stats.rank_gauges.items()):
            family.add_metric([str(rank)], values.get(key, 0.0))
        yield family


def _transfers(stats: RuntimeStats) -> Iterator[Metric]:
    for name, key, doc in TRANSFER_COUNTERS:
        family = CounterMetricFamily(name, doc, labels=["rank", "peer"])
        for (rank, peer), values in sorted(stats.transfers.items()):
            family.add_metric([str(rank), str(peer)], values.get(key, 0.0))
        yield family


def _kv_pools(stats: RuntimeStats) -> Iterator[Metric]:
    pools = sorted((key, v) for key, v in stats.engine_ranks.items() if "kv_blocks_total" in v)
    total = GaugeMetricFamily("walkserve_kv_pool_blocks_total", "KV blocks in the pool.", labels=["component", "rank"])
    free = GaugeMetricFamily("walkserve_kv_pool_blocks_free", "KV blocks not in use.", labels=["component", "rank"])
    for (comp, rank), values in pools:
        total.add_metric([comp, str(rank)], values["kv_blocks_total"])
        free.add_metric([comp, str(rank)], values["kv_blocks_total"] - values.get("kv_blocks_used", 0.0))
    yield from (total, free)
    for kind, specs in ((GaugeMetricFamily, KV_GAUGES), (CounterMetricFamily, KV_COUNTERS)):
        for name, key, doc in specs:
            family = kind(name, doc, labels=["component", "rank"])
            for (comp, rank), values in pools:
                family.add_metric([comp, str(rank)], values.get(key, 0.0))
            yield family
