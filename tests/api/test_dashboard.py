"""Per node / rank / peer / KV-pool metrics on a live two-rank server, and the Grafana dashboard against them.

One server for the module: the embedded tiny Orpheus on ``orpheus-split`` (the LM on rank 0, the SNAC
codec on rank 1, tokens crossing through shared memory). After one speech request, every metric the
dashboard's PromQL names must be in the live ``/metrics``, with the labels its ``by``/legends use. A
speech model makes no text, so the text histograms are declared (HELP/TYPE) without a series yet:
exactly those are checked by name only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.api.real_server import in_thread_server, wait_for
from walkserve.cli.embedded import ensure_embedded
from walkserve.cli.placement_arg import placement_path
from walkserve.core.config import RuntimeConfig

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "walkserve.json"
TEXT_ONLY = {"walkserve_time_to_first_token_seconds_bucket", "walkserve_inter_token_latency_seconds_bucket",
             "walkserve_generation_tokens_total", "walkserve_http_rejected_total"}  # (and no 429 yet)
# Every label a walkserve series may carry: all bounded by the routes, the placement or an enum.
BOUNDED_LABELS = {"route", "status", "reason", "outcome", "node", "rank", "peer", "component", "engine", "name", "le"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path, _ = ensure_embedded(tmp_path_factory.mktemp("walkserve-cache"))
    with in_thread_server("orpheus", path, RuntimeConfig(max_running=4), placement=placement_path("orpheus-split"),
                          default_max_tokens=71) as s:
        yield s


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
def samples(server):
    r = httpx.post(f"{server.url}/v1/audio/speech", json={"input": "Metrics, please.", "response_format": "wav"}, timeout=120)
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
    assert unseen == TEXT_ONLY


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


def test_the_runtimes_queue_wait_is_observed(samples):
    """The conductor reports its admission wait as ``timings["queue_s"]``; the histogram counts the request."""
    assert value(samples, "walkserve_request_queue_seconds_count", route="/v1/audio/speech") == 1
