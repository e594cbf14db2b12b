"""The Ray launcher's planning, without Ray: one bundle per rank, and the messages for placements a cluster cannot meet."""

from __future__ import annotations

import importlib.util

import pytest

from walkserve.conductor.ray_cluster import (
    NodeInfo,
    check_feasible,
    explain_pending,
    join,
    plan_bundles,
    require_ray,
)
from walkserve.core.errors import PlacementError, WalkserveError
from walkserve.placement import parse_placement

GiB = 2**30


def placement(*ranks: dict):
    return parse_placement({"ranks": list(ranks), "nodes": [{"nodes": ["lm"], "ranks": [r["id"] for r in ranks]}]}, "p.yaml")


def node(ip: str, alive: bool = True, labels: dict | None = None, **total: float) -> NodeInfo:
    res = {"CPU": 4.0, "memory": 64.0 * GiB, f"node:{ip}": 1.0, **total}
    return NodeInfo(ip, f"id-{ip}", alive, res, dict(res), labels or {})


def test_one_bundle_per_rank_pinned_by_the_nodes_own_resource():
    p = placement({"id": 0, "device": "cpu"}, {"id": 2, "device": "cuda:1", "host": "10.0.0.7", "memory": "8GiB"},
                  {"id": 1, "device": "cpu", "node_labels": {"zone": "b"}})
    bundles = plan_bundles(p, "10.0.0.1")
    assert [b.rank for b in bundles] == [0, 1, 2]  # bundle i hosts the i-th rank id
    assert bundles[0].resources == {"CPU": 1.0, "node:10.0.0.1": 0.001}  # no host: the conductor's node
    assert bundles[1].resources == {"CPU": 1.0} and bundles[1].labels == {"zone": "b"} and bundles[1].host is None
    assert bundles[2].resources == {"GPU": 1.0, "memory": 8.0 * GiB, "node:10.0.0.7": 0.001}
    assert bundles[2].index == 1 and bundles[2].needs == {"GPU": 1.0, "memory": 8.0 * GiB}


def test_a_missing_host_is_named_with_the_live_nodes():
    p = placement({"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu"}, {"id": 2, "device": "cpu", "host": "127.0.0.9"})
    nodes = [node("127.0.0.2"), node("127.0.0.3"), node("127.0.0.4", alive=False)]
    with pytest.raises(PlacementError) as err:
        check_feasible(p.source, plan_bundles(p, "127.0.0.2"), nodes)
    assert str(err.value) == "p.yaml: ranks[2]: host 127.0.0.9 is not in the Ray cluster (alive: 127.0.0.2, 127.0.0.3)"


def test_too_few_resources_on_a_host_are_summed_over_its_ranks():
    p = placement({"id": 0, "device": "cuda", "host": "10.0.0.8"}, {"id": 1, "device": "cuda:1", "host": "10.0.0.8"},
                  {"id": 2, "device": "cpu", "host": "10.0.0.9", "memory": "100GiB"})
    nodes = [node("10.0.0.8", GPU=1.0), node("10.0.0.9")]
    with pytest.raises(PlacementError) as err:
        check_feasible(p.source, plan_bundles(p, "10.0.0.8"), nodes)
    message = str(err.value)
    assert "ranks[0, 1]: need GPU 2 on host 10.0.0.8, which has GPU 1" in message
    assert "ranks[2]: needs memory 100.00 GiB on host 10.0.0.9, which has memory 64.00 GiB" in message


def test_labels_no_node_carries_are_named():
    p = placement({"id": 0, "device": "cpu", "node_labels": {"zone": "c"}})
    with pytest.raises(PlacementError, match=r"ranks\[0\]: no live node in the Ray cluster has node labels zone=c"):
        check_feasible(p.source, plan_bundles(p, "10.0.0.1"), [node("10.0.0.1", labels={"zone": "a"})])
    check_feasible(p.source, plan_bundles(p, "10.0.0.1"), [node("10.0.0.2", labels={"zone": "c"})])


def test_a_feasible_group_that_was_not_reserved_in_time_says_what_is_free():
    p = placement({"id": 0, "device": "cpu"}, {"id": 1, "device": "cuda", "host": "10.0.0.8"})
    bundles = plan_bundles(p, "10.0.0.1")
    busy = node("10.0.0.8", GPU=2.0)
    busy.available["GPU"] = 0.0
    message = explain_pending(p.source, bundles, [node("10.0.0.1"), busy], 30.0)
    assert message == ("p.yaml: Ray could not reserve the ranks' resources within 30 s: ranks[1]: host 10.0.0.8 has "
                       "GPU 0 free of the GPU 1 needed (other work holds the rest)")
    assert "ranks[1]: host 10.0.0.8 left the Ray cluster" in explain_pending(p.source, bundles, [node("10.0.0.1")], 30.0)


def test_a_ray_placement_without_ray_installed_fails_in_one_line(monkeypatch):
    p = placement({"id": 0, "device": "cpu", "host": "10.0.0.7"})
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(PlacementError) as err:
        require_ray(p)
    assert str(err.value) == ("p.yaml: this placement starts its ranks through Ray (ranks[0] is on host 10.0.0.7), "
                              "but ray is not installed: pip install 'walkserve[ray]'")
    require_ray(placement({"id": 0, "device": "cpu"}))  # a local placement never needs it


@pytest.mark.parametrize("address", ["local", "ray://10.0.0.7:10001"])
def test_walkserve_only_joins_a_running_cluster_as_a_driver(address):
    with pytest.raises(WalkserveError, match="joins a running cluster .* neither starts one nor connects through Ray Client"):
        join(address)
