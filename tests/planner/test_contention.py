"""The host's cores shared by the CPU ranks on it (processor sharing in the simulation's clock, and the bound), and
the replica each request's units land on.

Every figure is arithmetic over the node costs the test sets: a step of ``a`` or
``b`` costs 4 ms an item at one thread (half that at two), nothing else is paid.
"""

import pytest

from tests.planner.test_simulate import STEPS, _start, cost, costs, null, pipeline, placement
from walkserve.core.errors import ConfigError
from walkserve.graph import Client, FunctionStateMachine, GraphEdge, GraphNode, Walk, WalkGraph
from walkserve.placement.plan import parse_placement
from walkserve.planner.costs import CostTable
from walkserve.planner.devices import host_cores, parse_devices
from walkserve.planner.flow import build_flow
from walkserve.planner.score import rank_threads, score
from walkserve.planner.simulate import Load, Simulation, simulate

LOAD = Load(8, requests=32)  # enough in flight that every replica is always stepping


def table(**fields) -> CostTable:
    t = costs({"a": cost(0.0, 0.004), "b": cost(0.0, 0.004)}, {"a": STEPS, "b": STEPS})
    for k, v in fields.items():
        setattr(t, k, v)
    return t


def replicas(hosts: tuple = (None, None)) -> object:
    """[a, b] on two CPU ranks, ``hosts`` theirs."""
    ranks = [{"id": i, "device": "cpu"} | ({"host": h} if h else {}) for i, h in enumerate(hosts)]
    return parse_placement({"ranks": ranks, "nodes": [{"nodes": ["a", "b"], "ranks": [0, 1]}]}, "<t>")


def run(t: CostTable, p, **kw) -> float:
    return simulate(t, pipeline(), p, LOAD, null("a", "b"), **kw).throughput


def test_a_workers_measured_cores_slow_the_ranks_that_run_beside_it():
    # two one-thread replicas on two cores: alone on a core each if a worker keeps one core busy while it steps; if
    # it keeps 1.5 busy (its receiving and sending threads beside torch's), the two want 3 cores of 2, and each
    # step runs at 2/3 of its speed: 2/3 of the throughput, in the simulation and in the bound alike
    p = replicas()
    free = run(table(worker_cpu={1: 1.0}), p)
    crowded = run(table(worker_cpu={1: 1.5}), p)
    assert free == pytest.approx(2 / (STEPS * 0.008), rel=0.05)  # each replica 80 ms a request, two at once
    assert crowded / free == pytest.approx(2 / 3, rel=0.02)
    bound = [score(table(worker_cpu={1: c}), pipeline(), p, 8) for c in (1.0, 1.5)]
    assert not bound[0].host_bound and bound[1].host_bound
    assert bound[1].throughput / bound[0].throughput == pytest.approx(2 / 3, rel=1e-6)


def test_demand_is_measured_per_thread_count_or_taken_as_the_threads():
    t = table()
    assert (t.demand(1), t.demand(3)) == (1.0, 3.0)  # not measured: a worker keeps its threads busy
    t.worker_cpu = {1: 1.2, 2: 1.8}
    assert (t.demand(1), t.demand(2), t.demand(4)) == (1.2, 1.8, pytest.approx(3.6))  # beyond: scaled from 2


def test_the_profiles_core_count_stands_unless_the_devices_give_one():
    # the conftest's host has 2 cores; a profile taken on a 1-core host plans for 1 core: the two replicas share it
    p = replicas()
    here, profiled_on_one = run(table(), p), run(table(cores=1), p)
    assert here / profiled_on_one == pytest.approx(2, rel=0.05)
    assert run(table(cores=1), p, cores=2) == pytest.approx(here)  # a count given for the host wins
    assert rank_threads(p, table(cores=4)) == {0: 2, 1: 2}  # and divides over the ranks as the worker does


def test_each_host_shares_only_its_own_cores():
    # one replica on each of two one-core hosts runs as two replicas on a local 2-core host; both on one of them,
    # at half the speed
    t = table()
    apart = run(t, replicas(("h1", "h2")), cores={"h1": 1, "h2": 1})
    together = run(t, replicas(("h1", "h1")), cores={"h1": 1, "h2": 1})
    assert apart == pytest.approx(run(t, replicas()), rel=1e-6)
    assert apart / together == pytest.approx(2, rel=0.05)
    assert rank_threads(replicas(("h1", "h2")), t, {"h1": 4, "h2": 2}) == {0: 2, 1: 1}


def test_threads_beyond_the_cores_buy_nothing(monkeypatch):
    # WALKSERVE_WORKER_THREADS=2 on two ranks of a 2-core host: each step is twice as fast (2 threads) but the
    # two ranks want 4 cores of 2, so each runs at half speed: the throughput of one thread each
    p = replicas()
    one = run(table(), p)
    monkeypatch.setenv("WALKSERVE_WORKER_THREADS", "2")
    assert rank_threads(p, table()) == {0: 2, 1: 2}
    assert run(table(), p) == pytest.approx(one, rel=0.02)
    assert run(table(), p, worker_threads=1) == pytest.approx(one, rel=1e-6)  # a config given outright wins
    assert rank_threads(placement([(["a", "b"], [0])]), table()) == {0: 1}  # a GPU rank's worker: one thread


def test_gpu_ranks_do_not_share_the_hosts_cores():
    p = placement([(["a", "b"], [0, 1])])
    assert run(table(worker_cpu={1: 3.0}, cores=1), p) == pytest.approx(run(table(), p), rel=1e-9)


def test_a_devices_file_gives_a_hosts_cores(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text("- {device: cpu:0-1, host: a, cores: 8}\n- {device: cpu, host: b, cores: 4}\n- {device: cuda:0}\n")
    assert host_cores(parse_devices(str(f))) == {"a": 8, "b": 4}
    f.write_text("- {device: cpu, host: a, cores: 8}\n- {device: cpu, host: a, cores: 4}\n")
    with pytest.raises(ConfigError, match="8 and 4 cores"):
        parse_devices(str(f))
    f.write_text("- {device: cpu, cores: none}\n")
    with pytest.raises(ConfigError, match="positive whole number"):
        parse_devices(str(f))


def test_the_profile_keeps_its_core_count_and_worker_cpu(tmp_path):
    t = table(cores=2, worker_cpu={1: 1.15, 2: 1.9})
    path = tmp_path / "p.json"
    t.save(path)
    back = CostTable.load(path)
    assert (back.cores, back.worker_cpu) == (2, {1: 1.15, 2: 1.9})
    old = t.to_json()
    del old["cores"], old["worker_cpu"]
    assert (CostTable.from_json(old).cores, CostTable.from_json(old).worker_cpu) == (0, {})  # cached before them


def prefill_then_decode() -> WalkGraph:
    """Orpheus's walks: a prefill walk of ``a`` alone, then a decode walk that loops ``a`` and streams it to ``b``."""
    pre = Walk("prefill", GraphNode("a", ["x"], ["x"]), [GraphEdge("input.x", "a.x"), GraphEdge("a.x", Client("text"))],
               ["x"])
    return WalkGraph("two", [pre, *pipeline().walks.values()], FunctionStateMachine(_start))


def test_a_replica_is_chosen_as_the_conductor_chooses_it():
    # one request at a time on [a, b] x2. The conductor places a walk's nodes on the least loaded replica, and a
    # node a later walk places goes where the request already runs: a prefill walk placing a (rank 0) and a decode
    # walk placing b later keep both on rank 0, as one walk running both does, so nothing crosses and the request
    # runs as on one rank (before, b went to the other replica and every item of a crossed, as on [a] | [b])
    t = costs({"a": cost(0.001), "b": cost(0.004)}, {"a": STEPS, "b": STEPS})
    for graph in (pipeline(), prefill_then_decode()):
        sim = Simulation(t, build_flow(t, graph, {}), graph, placement([(["a", "b"], [0, 1])]), Load(1, requests=2))
        sc = sim.run()
        assert [sim.homes[r] for r in (0, 1)] == [[[0], [0]], [[0], [0]]]
    one = simulate(t, prefill_then_decode(), placement([(["a", "b"], [0])]), Load(1, requests=2), {})
    assert sc.throughput == pytest.approx(one.throughput, rel=1e-9)
    assert sc.rank_busy[0] == pytest.approx(one.rank_busy[0], rel=1e-9)
