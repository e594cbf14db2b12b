"""Real-time stream families at scrape time: the conductor's admission (``RuntimeStats.streams``) and each
rank's deadline scheduling (slack at dispatch, members held back, the rank's own gap count). Labels: ``node``
and ``rank`` (the placement's), nothing per request. The API's own per-route stream metrics (the client's
playback clock) are in ``ApiMetrics`` (walkserve/api/playback.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from walkserve.entrypoint.interface import RuntimeStats
from walkserve.protocol.rank_stats import SLACK_EDGES_S

RANK_STREAM_COUNTERS = (  # (family, RuntimeStats.rank_streams key, help)
    ("walkserve_stream_held_paced", "held_paced", "Stream member-steps a rank held back: far ahead of playback (pacing)."),
    ("walkserve_stream_held_capacity", "held_capacity", "Stream member-steps a rank held back: the step was full."),
    ("walkserve_rank_stream_gaps", "gaps", "Chunks a rank completed after the modelled client ran out of audio."),
    ("walkserve_rank_stream_gap_seconds", "gap_s", "Total lateness of those chunks (the rank's view)."),
)

STREAM_GAUGES = (
    ("running", "walkserve_streams_running", "Real-time streams the runtime is running."),
    ("waiting", "walkserve_streams_waiting", "Real-time streams waiting to start within their TTFA budget."),
    ("capacity", "walkserve_stream_capacity", "Streams the runtime admits at once now (estimated real-time capacity)."),
    ("capacity_measured", "walkserve_stream_capacity_measured", "1 once the capacity comes from measured step costs, 0 in warm-up."),
    ("estimate", "walkserve_stream_capacity_estimate", "The capacity model's estimate, before a cap (the warm-up count until measured)."),
    ("capped", "walkserve_stream_capacity_capped", "1 while admission is capped below the estimate: a stream ran out of audio."),
    ("probed", "walkserve_stream_capacity_probed", "Streams admitted past the estimate: every running stream kept "
     "enough lead by projection at the bound."),
    ("load", "walkserve_stream_load", "Busiest rank's share of time the running streams need (estimate)."),
)


def stream_families(stats: RuntimeStats) -> Iterator[Metric]:
    """The conductor's stream admission, then each rank's deadline scheduling."""
    streams = stats.streams
    for key, name, doc in STREAM_GAUGES:
        yield GaugeMetricFamily(name, doc, value=streams.get(key, 0.0))
    yield CounterMetricFamily("walkserve_streams_admitted", "Real-time streams the runtime admitted.",
                              value=streams.get("admitted", 0.0))
    yield CounterMetricFamily("walkserve_streams_rejected_capacity", "Real-time streams rejected: over capacity.",
                              value=streams.get("rejected_capacity", 0.0))


    yield from _slack(stats.slack)
    for name, key, doc in RANK_STREAM_COUNTERS:
        family = CounterMetricFamily(name, doc, labels=["rank"])
        for rank, values in sorted(stats.rank_streams.items()):
            family.add_metric([str(rank)], values.get(key, 0.0))
        yield family


def _slack(slack: dict[tuple[str, int], list[int]]) -> Iterator[Metric]:
    """Members dispatched per slack bucket (``RankStats.slack``) as a histogram per node and rank (no _sum:
    the ranks count buckets only)."""
    family = HistogramMetricFamily("walkserve_stream_slack_seconds", "Slack of stream work when a rank dispatched it "
                                   "(deadline - now - time to produce its next chunk).", labels=["node", "rank"])
    edges = [*(floatToGoString(e) for e in SLACK_EDGES_S), "+Inf"]
    for (node, rank), counts in sorted(slack.items()):
        cumulative = list(accumulate(counts[: len(edges)]))
        cumulative += [cumulative[-1] if cumulative else 0] * (len(edges) - len(cumulative))
        family.add_metric([node, str(rank)], list(zip(edges, map(float, cumulative))), None)
    yield family
