"""Per node / rank / peer / KV-pool metrics on a live two-rank server, and the Grafana dashboard against them.

The session's shared server (``orpheus_split`` in conftest.py): the embedded tiny Orpheus on
``orpheus-split`` (the LM on rank 0, the SNAC codec on rank 1, tokens crossing through shared memory).
After one speech request, every metric the dashboard's PromQL names must be in the live ``/metrics``,
with the labels its ``by``/legends use. A speech model makes no text, so the text histograms are declared
(HELP/TYPE) without a series yet: exactly those are checked by name only, with the series only an event
makes (a 429, a stream's gap), which other tests on the shared server may or may not have caused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.api.real_server import wait_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "walkserve.json"
TEXT_ONLY = {"walkserve_time_to_first_token_seconds_bucket", "walkserve_inter_token_latency_seconds_bucket",
             "walkserve_generation_tokens_total", "walkserve_http_rejected_total"}  # (and no 429 yet)
EVENT_ONLY = {"walkserve_http_rejected_total", "walkserve_audio_streams_rejected_total",  # a 429, a gap
              "walkserve_audio_streams_with_gaps_total", "walkserve_audio_stream_gaps_total",
              "walkserve_audio_stream_gap_seconds_total"}
# Every label a walkserve series may carry: all bounded by the routes, the placement or an enum.
# seeded: unseeded, the random LM samples END_OF_SPEECH early in about one answer in seventy, and one that ends
# before its first frame leaves the codec's rank without a batch
SEED = 11
BOUNDED_LABELS = {"route", "status", "reason", "outcome", "node", "rank", "peer", "component", "engine", "name", "le"}


@pytest.fixture(scope="module")
def server(orpheus_split):
    return orpheus_split


def scrape(url: str) -> dict[str, list[dict[str, str]]]:
    """Sample name -> the label sets it has in /metrics; a family with no sample yet -> [] under each name
    PromQL may use for it (a histogram's _bucket, _sum and _count, a counter's _total)."""
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",)}.get(family.type, ("",))
        for suffix in suffixes:
            out.setdefault(family.name + suffix, [])
        for sample in family.samples:
            out.setdefault(sample.name, []).append({**sample.labels, "_value": sample.value})
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    for s in samples.get(name, []):
        if all(s.get(k) == v for k, v in labels.items()):
            return s["_value"]
    raise AssertionError(f"no {name}{labels} in /metrics")


@pytest.fixture(scope="module")
def before(server):
    """/metrics before this module's request (other modules may have used the shared server)."""
    return scrape(server.url)


@pytest.fixture(scope="module")
def samples(server, before):
    body = {"input": "Metrics, please.", "response_format": "wav", "seed": SEED}
    r = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text

    def codec_ran() -> dict | None:
        now = scrape(server.url)
        rows = [s for s in now.get("walkserve_node_rank_batches_total", []) if s["rank"] == "1" and s["_value"] > 0]
        # Each rank reports its stats on its own period: wait for rank 0's report of what it sent rank 1 too.
        sent = [s for s in now.get("walkserve_transfer_messages_total", []) if s["rank"] == "0" and s["_value"] > 0]
        return now if rows and sent else None

    assert wait_for(codec_ran, 30), "the codec's rank never reported a batch (or rank 0 never reported sending to it)"
    return codec_ran()


def test_per_node_and_rank_series(samples):
    assert value(samples, "walkserve_node_rank_batches_total", node="lm", rank="0") > 0
    assert value(samples, "walkserve_node_rank_items_total", node="lm", rank="0") >= value(
        samples, "walkserve_node_rank_batches_total", node="lm", rank="0")
    assert value(samples, "walkserve_node_rank_busy_seconds_total", node="lm", rank="0") > 0
    codec = [s for s in samples["walkserve_node_rank_batches_total"] if s["rank"] == "1"]
    assert codec and all(s["node"] != "lm" for s in codec)  # the placement: the LM only on rank 0
    for rank in ("0", "1"):
        assert value(samples, "walkserve_rank_queue_depth", rank=rank) >= 0


def test_transfers_between_ranks(samples):
    assert value(samples, "walkserve_transfer_messages_total", rank="0", peer="1") > 0
    assert value(samples, "walkserve_transfer_tensors_total", rank="0", peer="1") > 0
    assert value(samples, "walkserve_transfer_bytes_total", rank="0", peer="1") > 0
    assert value(samples, "walkserve_transfer_seconds_total", rank="0", peer="1") > 0


def test_kv_pool_series(samples):
    [pool] = samples["walkserve_kv_pool_blocks_total"]
    assert pool["rank"] == "0" and pool["_value"] > 0
    labels = {"component": pool["component"], "rank": "0"}
    used, free = value(samples, "walkserve_kv_pool_blocks_used", **labels), value(samples, "walkserve_kv_pool_blocks_free", **labels)
    assert used + free == pool["_value"]
    assert value(samples, "walkserve_kv_pool_preemptions_total", **labels) == 0
    assert value(samples, "walkserve_kv_pool_prefix_hit_tokens_total", **labels) >= 0
    assert value(samples, "walkserve_kv_pool_prefill_tokens_total", **labels) > 0  # the speech request's prompt ran


def test_labels_are_bounded(samples):
    used = {k for rows in samples.values() for s in rows for k in s if k != "_value"}
    assert used <= BOUNDED_LABELS, used - BOUNDED_LABELS


def _targets() -> list[dict]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t for p in panels for t in p.get("targets", [])]


def test_every_dashboard_query_resolves_against_the_live_server(samples):
    targets = _targets()
    assert len(targets) >= 20
    unseen = set()
    for target in targets:
        expr = target["expr"]
        names = set(re.findall(r"\bwalkserve_[a-z0-9_]+", expr))
        assert names, f"a query with no walkserve metric: {expr}"
        missing = names - set(samples)
        assert not missing, f"{expr}: not in /metrics: {missing}"
        unseen |= {n for n in names if not samples[n]}
        if any(not samples[n] for n in names):
            continue  # declared, no series yet: its labels are checked where it has one
        have = {k for n in names for s in samples[n] for k in s}
        for group in re.findall(r"\bby \(([^)]*)\)", expr):
            wanted = {label.strip() for label in group.split(",")} - {"le"}
            assert wanted <= have, f"{expr}: grouped by labels the series lack: {wanted - have}"
        legend = set(re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")))
        assert legend <= have, f"{expr}: legend names labels the series lack: {legend - have}"
    assert TEXT_ONLY - EVENT_ONLY <= unseen <= TEXT_ONLY | EVENT_ONLY


def test_dashboard_covers_the_bottleneck_view():
    exprs = " ".join(t["expr"] for t in _targets())
    for needed in ("walkserve_http_responses_total", "walkserve_e2e_request_latency_seconds_bucket",
                   "walkserve_node_rank_busy_seconds_total", "walkserve_node_rank_batches_total",
                   "walkserve_kv_pool_blocks_used", "walkserve_transfer_bytes_total"):
        assert needed in exprs, needed


def test_prometheus_scrape_config_points_at_metrics():
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"]


def test_the_runtimes_queue_wait_is_observed(samples, before):
    """The conductor reports its admission wait as ``timings["queue_s"]``; the histogram counts the request."""
    route = "/v1/audio/speech"
    earlier = [s["_value"] for s in before.get("walkserve_request_queue_seconds_count", []) if s.get("route") == route]
    assert value(samples, "walkserve_request_queue_seconds_count", route=route) == sum(earlier) + 1
