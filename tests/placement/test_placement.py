"""Placement YAML: schema, per-walk entries, replicas, and errors that name the file and the entry."""

from __future__ import annotations

import pytest

from walkserve.core.errors import PlacementError
from walkserve.placement import load_placement, parse_placement

WALKS = {"prefill": ["lm"], "decode": ["lm", "codec"]}


def write(tmp_path, text):
    p = tmp_path / "placement.yaml"
    p.write_text(text)
    return p


def test_per_walk_and_replicated_placement(tmp_path):
    p = load_placement(
        write(
            tmp_path,
            """
ranks:
  - {id: 0, device: cpu, memory: 2GiB}
  - {id: 1, device: cuda:0}
  - {id: 2, device: cuda:1, host: 10.0.0.2}
nodes:
  - {nodes: [lm], ranks: [0]}
  - {nodes: [lm], ranks: [1], walks: [decode]}
  - {nodes: [codec], ranks: [1, 2]}
""",
        )
    )
    p.check_covers(WALKS)
    assert p.ranks_for("prefill", "lm") == (0,)
    assert p.ranks_for("decode", "lm") == (1,)
    assert p.ranks_for("decode", "codec") == (1, 2)
    assert p.ranks[0].memory == 2 * 2**30 and p.ranks[2].remote and not p.ranks[0].remote
    assert p.nodes_on(1, WALKS) == {("decode", "lm"), ("decode", "codec")}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("ranks: [{id: 0}]\nnodes: [{nodes: [lm], ranks: [0]}]", r"placement.yaml: ranks\[0\]: rank 0 has no device"),
        ("ranks: [{id: 0, device: tpu}]\nnodes: [{nodes: [lm], ranks: [0]}]", r"ranks\[0\]: device 'tpu'"),
        ("ranks: [{id: 0, device: cpu}]\nnodes: [{nodes: [lm], ranks: [3]}]", r"nodes\[0\]: unknown rank 3"),
        (
            "ranks: [{id: 0, device: cpu}]\nnodes: [{nodes: [lm], ranks: [0]}, {nodes: [lm], ranks: [0]}]",
            r"nodes\[1\]: node 'lm' is already placed for all walks \(conflicting entries\)",
        ),
        (
            "ranks: [{id: 0, device: cpu}, {id: 0, device: cpu}]\nnodes: [{nodes: [lm], ranks: [0]}]",
            r"ranks\[1\]: duplicate rank id 0",
        ),
        ("ranks: [{id: 0, device: cpu, memory: lots}]\nnodes: [{nodes: [lm], ranks: [0]}]", "memory 'lots'"),
        ("ranks: [{id: 0, device: cpu}]\nnodes: [{nodes: [lm], rank: [0]}]", r"nodes\[0\]: unknown field"),
        ("ranks: [{id: 0, device: cpu}]\nnodes: [{nodes: [lm], ranks: [0]}]\nextra: 1", "unknown top-level"),
        ("ranks: [\n", "not valid YAML"),
    ],
)
def test_errors_name_file_and_entry(tmp_path, text, match):
    with pytest.raises(PlacementError, match=match):
        load_placement(write(tmp_path, text))


def test_coverage_errors():
    p = parse_placement({"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [0]}]}, "p.yaml")
    with pytest.raises(PlacementError, match="p.yaml: node 'codec' of walk 'decode' is not placed"):
        p.check_covers(WALKS)
    q = parse_placement({"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm", "codec", "snak"], "ranks": [0]}]}, "q.yaml")
    with pytest.raises(PlacementError, match="q.yaml: unknown node 'snak'"):
        q.check_covers(WALKS)
    r = parse_placement(
        {"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm", "codec"], "ranks": [0], "walks": ["dekode"]}]}, "r.yaml"
    )
    with pytest.raises(PlacementError, match="unknown walk 'dekode'"):
        r.check_covers(WALKS)


def test_memory_check_names_the_rank_and_the_parts():
    p = parse_placement({"ranks": [{"id": 0, "device": "cpu", "memory": "1GiB"}], "nodes": [{"nodes": ["lm"], "ranks": [0]}]})
    p.check_memory({0: [("weights of lm", 2**29), ("KV pool", 2**28)]})
    with pytest.raises(PlacementError, match=r"rank 0 \(cpu\) needs 1.25 GiB .*weights of lm 0.50 GiB.*budget of 1.00 GiB"):
        p.check_memory({0: [("weights of lm", 2**29), ("KV pool", 2**29 + 2**28)]})


def test_missing_file():
    with pytest.raises(PlacementError, match="cannot read placement file"):
        load_placement("/nonexistent/placement.yaml")


def test_cpu_ranks_must_fit_in_the_hosts_ram():
    from walkserve.placement.resolve import check_host_memory

    p = parse_placement(
        {"ranks": [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu"}, {"id": 2, "device": "cpu", "memory": "1TiB"}],
         "nodes": [{"nodes": ["lm"], "ranks": [0, 1, 2]}]},
        "p.yaml",
    )
    demands = {0: [("weights of lm", 6 * 2**30)], 1: [("weights of lm", 6 * 2**30)], 2: [("weights of lm", 6 * 2**30)]}
    check_host_memory(p, demands, available=16 * 2**30)  # ranks 0 and 1 share 16 GiB; rank 2 has its own budget
    with pytest.raises(PlacementError, match=r"CPU ranks need 12.00 GiB of RAM .* 10.00 GiB available"):
        check_host_memory(p, demands, available=10 * 2**30)
    check_host_memory(p, demands, available=None)  # unknown: no check


def _with_host(host: str | None) -> dict:
    rank = {"id": 1, "device": "cpu", **({"host": host} if host else {})}
    return {"ranks": [{"id": 0, "device": "cpu"}, rank], "nodes": [{"nodes": ["lm"], "ranks": [0, 1]}]}


def test_a_rank_on_another_host_passes_the_model_checks_and_goes_through_ray():
    """A remote ``host`` is launched (through Ray), so loading no longer refuses it; its RAM is not this host's."""
    from walkserve.placement.resolve import check_placement
    from walkserve.testing.fixtures.lm import build_graph

    graph = build_graph()
    for host in ("localhost", "10.0.0.2"):
        placement = parse_placement(_with_host(host), "p.yaml")
        check_placement(placement, graph, set(), {}, {})
        assert placement.launcher == ("local" if host == "localhost" else "ray")


def test_a_rank_on_another_host_or_with_node_labels_makes_the_placement_start_through_ray():
    ranks = [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cuda", "host": "10.0.0.7"}]
    p = parse_placement({"ranks": ranks, "nodes": [{"nodes": ["lm"], "ranks": [0, 1]}]}, "p.yaml")
    assert p.launcher == "ray" and p.ray_reason() == "ranks[1] is on host 10.0.0.7"
    assert [s.transport for s in p.ranks.values()] == ["tcp", "tcp"]  # Ray ranks talk TCP, even the local one
    labelled = [{"id": 0, "device": "cpu", "node_labels": {"zone": "a", "size": 2}}]
    q = parse_placement({"ranks": labelled, "nodes": [{"nodes": ["lm"], "ranks": [0]}]}, "q.yaml")
    assert q.launcher == "ray" and q.ranks[0].node_labels == (("size", "2"), ("zone", "a"))
    local = parse_placement({"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [0]}]})
    assert local.launcher == "local" and local.ranks[0].transport == "ipc" and local.ray_reason() == ""
    explicit = parse_placement({"launcher": "ray", "ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [0]}]})
    assert explicit.launcher == "ray" and explicit.ray_reason() == "it says launcher: ray"


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"launcher": "slurm"}, r"p.yaml: launcher 'slurm' is not local or ray"),
        ({"launcher": "local", "host": "10.0.0.7"}, r"p.yaml: ranks\[0\] is on another host .* only launcher: ray"),
        ({"launcher": "ray", "transport": "ipc"}, r"ranks\[0\]: rank 0 is started through Ray, whose ranks talk TCP"),
        ({"node_labels": ["a"]}, r"ranks\[0\]: node_labels must map label names to values"),
        ({"host": 7}, r"ranks\[0\]: host must be a node's IP address as a string"),
    ],
)
def test_launcher_errors_name_the_file_and_the_rank(data, match):
    top = {k: v for k, v in data.items() if k == "launcher"}
    rank = {"id": 0, "device": "cpu", **{k: v for k, v in data.items() if k != "launcher"}}
    with pytest.raises(PlacementError, match=match):
        parse_placement({**top, "ranks": [rank], "nodes": [{"nodes": ["lm"], "ranks": [0]}]}, "p.yaml")


def test_a_placement_that_separates_kv_sharing_components_is_refused_naming_both():
    from walkserve.graph import DROP, GraphEdge, GraphNode, Sequential, Walk, WalkGraph
    from walkserve.graph.walk import FunctionStateMachine, WalkStart
    from walkserve.placement.resolve import check_placement

    walk = Walk("act", Sequential(GraphNode("vlm", ["x"], ["h"]), GraphNode("expert", ["h"], ["a"])),
                edges=[GraphEdge("input.x", "vlm.x"), GraphEdge("vlm.h", "expert.h"), GraphEdge("expert.a", DROP)],
                inputs=["x"])
    graph = WalkGraph("pi", [walk], FunctionStateMachine(lambda r: WalkStart("act", {}), lambda r, w, o: None))
    shares = {"vlm": "pi", "expert": "pi"}
    ranks = [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu"}]
    together = parse_placement({"ranks": ranks, "nodes": [{"nodes": ["vlm", "expert"], "ranks": [1]}]})
    check_placement(together, graph, {"vlm", "expert"}, {}, {}, kv_shares=shares)
    apart = parse_placement({"ranks": ranks, "nodes": [{"nodes": ["vlm"], "ranks": [0]}, {"nodes": ["expert"], "ranks": [1]}]})
    with pytest.raises(PlacementError, match=r"components 'vlm' and 'expert' share KV contexts"):
        check_placement(apart, graph, {"vlm", "expert"}, {}, {}, kv_shares=shares)


def test_a_request_stays_inside_one_replica_of_a_replicated_block():
    """Two full replicas: the decode walk's codec goes where the request's LM already runs, even when the other
    replica is less loaded (before, every codec window crossed to it); a component with no replica the request
    uses, and the first one placed, take the least loaded rank."""
    from types import SimpleNamespace

    from walkserve.placement.choice import choose_rank

    def plan(name, *nodes):
        return SimpleNamespace(name=name, nodes={n: SimpleNamespace(component=n) for n in nodes})

    p = parse_placement({"ranks": [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu"}, {"id": 2, "device": "cpu"}],
                         "nodes": [{"nodes": ["lm", "codec"], "ranks": [0, 1]}, {"nodes": ["vae"], "ranks": [2]},
                                   {"nodes": ["tail"], "ranks": [1, 2]}]}, "two.yaml")
    load = {0: 5, 1: 0, 2: 3}.__getitem__
    sticky: dict[str, int] = {}
    assert choose_rank(p, plan("prefill", "lm"), "lm", sticky, load) == 1  # the least loaded replica
    assert choose_rank(p, plan("decode", "lm", "codec"), "codec", sticky, {0: 0, 1: 9, 2: 0}.__getitem__) == 1
    assert sticky == {"lm": 1, "codec": 1}
    assert choose_rank(p, plan("decode", "vae"), "vae", sticky, load) == 2  # one candidate: no choice
    assert choose_rank(p, plan("decode", "tail"), "tail", sticky, load) == 1  # rank 1 is the request's already
    other: dict[str, int] = {"lm": 0}
    busy_one = {0: 0, 1: 4, 2: 3}.__getitem__
    assert choose_rank(p, plan("decode", "tail"), "tail", other, busy_one) == 2  # none of its ranks: the least loaded
