"""Stream families at scrape time: the conductor's admission gauges and the ranks' slack histogram and counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from walkserve.api.stream_metrics import stream_families
from walkserve.entrypoint.interface import RuntimeStats
from walkserve.entrypoint.stats import runtime_stats
from walkserve.protocol import messages as m
from walkserve.protocol.rank_stats import SLACK_EDGES_S


class _Collector:
    def __init__(self, stats: RuntimeStats):
        self.stats = stats

    def collect(self):
        return stream_families(self.stats)


def scrape(stats: RuntimeStats) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    registry.register(_Collector(stats))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_slack_buckets_are_cumulative_per_node_and_rank_and_counters_per_rank():
    counts = [0] * (len(SLACK_EDGES_S) + 1)
    counts[0], counts[5], counts[-1] = 2, 3, 4  # below -1 s, in (0, 0.1], above 5 s
    rank = m.RankStats(slack={"codec": counts}, scheduling={"held_paced": 7, "gaps": 1}, gap_s=0.25)
    snapshot = m.RuntimeSnapshot(workers={1: rank}, counters={"streams_admitted": 5, "streams_rejected_capacity": 2},
                                 streams={"running": 2, "capacity": 3, "capacity_measured": 1, "load": 0.5,
                                          "probed": 1})
    got = scrape(runtime_stats(snapshot))
    bucket = "walkserve_stream_slack_seconds_bucket"
    labels = (("node", "codec"), ("rank", "1"))
    assert got[(bucket, (("le", "-1.0"), *labels))] == 2
    assert got[(bucket, (("le", "0.0"), *labels))] == 2
    assert got[(bucket, (("le", "0.1"), *labels))] == 5
    assert got[(bucket, (("le", "5.0"), *labels))] == 5
    assert got[(bucket, (("le", "+Inf"), *labels))] == 9
    assert got[("walkserve_stream_held_paced_total", (("rank", "1"),))] == 7
    assert got[("walkserve_rank_stream_gaps_total", (("rank", "1"),))] == 1
    assert got[("walkserve_rank_stream_gap_seconds_total", (("rank", "1"),))] == 0.25
    assert got[("walkserve_stream_capacity", ())] == 3 and got[("walkserve_streams_running", ())] == 2
    assert got[("walkserve_stream_capacity_probed", ())] == 1
    assert got[("walkserve_streams_admitted_total", ())] == 5
    assert got[("walkserve_streams_rejected_capacity_total", ())] == 2
