"""The planner on tiny Orpheus with synthetic node costs: the winner follows the costs, memory is respected."""

import pytest
import yaml

from tests.planner.conftest import table
from walkserve.core.errors import PlacementError
from walkserve.placement.plan import load_placement
from walkserve.planner.devices import Device, parse_devices
from walkserve.planner.planning import explain, placement_yaml, plan
from walkserve.planner.search import Checker, enumerate_candidates, partitions
from walkserve.planner.workload import default_workload


def test_partitions_are_every_split_once():
    assert len(list(partitions(4, 4))) == 15  # Bell(4)
    assert len(list(partitions(4, 2))) == 8
    assert all(max(p) < 2 for p in partitions(4, 2))


def test_expensive_codec_is_split_off(orpheus):
    # the LM batches well (a step costs the same at any batch): replicas would halve its batches, a split does not
    result = plan(orpheus, parse_devices("cpu:0,cpu:1"), table(0.01, 0.02, lm_fixed=True), default_workload("orpheus"))
    assert result.winner.name == "[lm] | [codec]"
    assert [c.name for c in result.ranked] == ["[lm] | [codec]", "[lm, codec] x2", "[lm, codec]"]
    assert "bottleneck" in result.why
    assert result.winner.score.throughput > max(c.score.throughput for c in result.ranked[1:])


def test_a_long_search_reports_its_progress(orpheus, monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr("walkserve.planner.search.PROGRESS_S", 0.0)  # every scored placement (a real search: 10 s)
    result = plan(orpheus, parse_devices("cpu:0,cpu:1"), table(0.01, 0.02, lm_fixed=True), default_workload("orpheus"),
                  progress=lines.append)
    assert len(lines) == result.considered == 3
    assert lines[0].startswith("plan: 1 placement on 2 devices scored in ")
    assert lines[-1].endswith(f"best so far {result.winner.name} at {result.winner.score.throughput:.3g} req/s")


def test_per_item_costs_favour_replicas(orpheus):
    # nothing gained by batching: two replicas each do half of every stage, a split leaves the codec rank busiest
    result = plan(orpheus, parse_devices("cpu:0,cpu:1"), table(0.002, 0.02), default_workload("orpheus"))
    assert result.winner.name == "[lm, codec] x2"
    assert "codec" in result.why


def test_cheap_codec_with_costly_messages_stays_on_one_rank(orpheus):
    # costly messages: splitting the cheap codec off loses to keeping each request on one rank, and two full
    # replicas send nothing between them (a request stays inside one, placement.choice), so they win
    for scorer in ("bound", "simulate"):
        result = plan(orpheus, parse_devices("cpu:0,cpu:1"), table(0.002, 0.0001, hop_s=0.01),
                      default_workload("orpheus"), scorer=scorer)
        assert [c.name for c in result.ranked] == ["[lm, codec] x2", "[lm, codec]", "[lm] | [codec]"], scorer


def test_ttfa_objective_and_slo(orpheus):
    w = default_workload("orpheus")
    costs = table(0.002, 0.02)
    fast = plan(orpheus, parse_devices("cpu:0,cpu:1"), costs, w, "ttfa")
    assert fast.winner.score.ttfa_s == min(c.score.ttfa_s for c in fast.ranked)
    with pytest.raises(PlacementError, match="meets the SLO"):
        plan(orpheus, parse_devices("cpu:0,cpu:1"), costs, w, "throughput", __import__(
            "walkserve.planner.planning", fromlist=["Slo"]).Slo(ttfa_s=1e-6))


def test_memory_bounds_the_candidates_and_names_the_smallest_set(orpheus):
    from walkserve.placement.memory import DEFAULT_CPU_KV_BYTES

    comps = orpheus.components()
    lm, codec = comps["lm"].weight_bytes, comps["codec"].weight_bytes
    # a rank with this budget holds the LM and its KV pool, or the codec, but not both
    budget = lm + DEFAULT_CPU_KV_BYTES + codec - 1
    devices = [Device("cpu", budget), Device("cpu", budget)]
    orpheus_kv = orpheus.ref.options
    cands = enumerate_candidates(orpheus, devices, table(0.002, 0.02), 4)
    assert [c.name for c in cands] == ["[lm] | [codec]"]
    for c in cands:
        Checker(orpheus, devices).check(c.data)  # what serve checks at start-up passes
        assert all(b <= budget for b in c.score.memory.values())
    with pytest.raises(PlacementError, match=r"smallest device set that holds it: 2 x cpu") as e:
        plan(orpheus, devices[:1], table(0.002, 0.02), default_workload("orpheus"))
    assert "1 device(s)" in str(e.value)
    assert orpheus_kv == orpheus.ref.options


def test_emitted_file_loads_and_explain_agrees(orpheus, tmp_path):
    costs = table(0.002, 0.02)
    w = default_workload("orpheus")
    result = plan(orpheus, parse_devices("cpu:0,cpu:1"), costs, w)
    path = tmp_path / "p.yaml"
    path.write_text(placement_yaml(result.winner, ["test"]))
    load_placement(path)
    again = explain(orpheus, yaml.safe_load(path.read_text()), str(path), costs, w.concurrency)
    assert again.score.throughput == pytest.approx(result.winner.score.throughput)
    assert "predicted (cost model, not measured)" in path.read_text()


def test_cpu_ranks_share_the_hosts_cores(orpheus):
    # three one-thread replicas on two cores run no faster than two: the host's cores bound them (free messages,
    # so that the replicas' extra edges do not blur the comparison)
    costs = table(0.002, 0.02, hop_s=0.0)
    costs.hop_latency_s = 0.0
    cands = {c.name: c for c in enumerate_candidates(orpheus, parse_devices("cpu:0-2"), costs, 4, scorer="bound")}
    x2, x3 = cands["[lm, codec] x2"].score, cands["[lm, codec] x3"].score
    assert x3.host_bound and not x2.host_bound
    assert x3.throughput == pytest.approx(x2.throughput)
    assert 1 / max(x3.rank_busy.values()) > x3.throughput  # each rank alone would have allowed more


def test_slow_hops_make_a_chatty_split_latency_bound(orpheus):
    # the analytical bound's Little's law counts every hop into a request's latency (the simulation overlaps the
    # hops of a stream the LM does not wait for: tests/planner/test_simulate.py)
    costs = table(0.01, 0.02, lm_fixed=True)
    costs.hop_latency_s = 0.05  # every LM token waits 50 ms to reach the codec's rank
    cands = {c.name: c for c in enumerate_candidates(orpheus, parse_devices("cpu:0,cpu:1"), costs, 4, scorer="bound")}
    split, one = cands["[lm] | [codec]"].score, cands["[lm, codec]"].score
    assert split.latency_bound and not one.latency_bound
    assert split.throughput < one.throughput
    # Little's law: 4 requests in flight over (the LM rank's steps + 64 token hops of 50 ms)
    assert split.throughput == pytest.approx(4 / (64 * 0.012 + 64 * 0.05), rel=1e-6)
