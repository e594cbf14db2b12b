"""The worker dataflow, on a virtual cluster with random placements and message orders, against the reference."""

from __future__ import annotations

import random

import pytest

import walkserve.testing.fixtures as fixtures
from walkserve.models.base import BuildContext, ModelRef
from walkserve.models.registry import load_model
from walkserve.testing.fixtures.requests import fixture_request
from walkserve.testing.reference import ReferenceExecutor
from walkserve.testing.simulator import Simulator
from walkserve.worker.plan_index import index_of


def setup(family):
    model = load_model(ModelRef(family))
    graph = model.graph()
    comps = {n: s.build(BuildContext(0, "cpu")) for n, s in model.components().items()}
    return graph, comps, ReferenceExecutor(graph, comps)


def normalized(result):
    outs = sorted(((o.modality, o.node, o.path), o.value.tolist()) for o in result.outputs)
    return outs, result.finish, result.walks, result.error is None, result.walk_outputs


@pytest.mark.parametrize("cohorts", [False, True], ids=["firings", "cohorts"])
@pytest.mark.parametrize("family", sorted(fixtures.FIXTURES))
@pytest.mark.parametrize("seed", range(6))
def test_virtual_cluster_matches_reference(family, seed, cohorts):
    graph, comps, ref = setup(family)
    rng = random.Random(seed)
    n_ranks = 1 + seed % 4
    placement = {n: rng.randrange(n_ranks) for n in graph.node_names()}
    per_walk = seed % 3 == 2  # also place nodes differently per walk (disaggregation)
    walk_salt = {w: rng.randrange(n_ranks) for w in graph.walks}

    def ranks_of(walk, node):
        return (placement[node] + (walk_salt[walk] if per_walk else 0)) % n_ranks

    sim = Simulator(graph, comps, ranks_of, seed=seed, futures=seed % 2 == 0, cohorts=cohorts)
    requests = [fixture_request(family, seed * 10 + i) for i in range(8)]
    for r in requests:
        sim.submit(r)
    results = sim.run()
    for r in requests:
        assert normalized(results[r.id]) == normalized(ref.run(r)), r.id
    assert sim.stats.max_wasted_per_node <= 1
    if cohorts and n_ranks == 1 and any(index_of(p).cohorts for p in graph.plans.values()):
        assert sim.cohort_of, "a loop that qualifies ran without a cohort"


@pytest.mark.parametrize("family", ["fixture-lm", "fixture-omni", "fixture-tts", "fixture-rollout"])
def test_speculation_off_runs_no_extra_step(family):
    graph, comps, ref = setup(family)
    for speculate in (True, False):
        sim = Simulator(graph, comps, lambda w, n: 0, seed=3, futures=True, speculate=speculate)
        requests = [fixture_request(family, i) for i in range(10)]
        for r in requests:
            sim.submit(r)
        results = sim.run()
        for r in requests:
            assert normalized(results[r.id]) == normalized(ref.run(r))
        if speculate:
            assert sim.stats.speculative > 0 and sim.stats.max_wasted_per_node <= 1
        else:
            assert sim.stats.speculative == 0 and sim.stats.wasted == 0


def test_loop_that_stops_at_k_yields_exactly_k_outputs():
    graph, comps, _ref = setup("fixture-lm")
    from walkserve.core.request import RequestSpec
    from walkserve.core.sampling import SamplingParams
    from walkserve.testing.fixtures.requests import prompt

    for k in range(0, 9):
        for speculate, cohorts in ((True, False), (False, False), (True, True)):
            sim = Simulator(graph, comps, lambda w, n: 0, seed=k, speculate=speculate, cohorts=cohorts)
            spec = RequestSpec({"prompt_ids": prompt(k, 3)}, sampling=SamplingParams(max_tokens=20), params={"eos_at": k})
            sim.submit(spec)
            res = sim.run()[spec.id]
            assert len(res.stream("text")) == k  # the EOS iteration itself is not exposed
            assert sim.stats.max_wasted_per_node <= (1 if speculate and not cohorts else 0)
            if cohorts:
                assert sim.stats.speculative == 0 and sim.stats.firings >= k + 1


def test_component_failure_fails_only_that_request():
    graph, comps, _ = setup("fixture-tts")
    sim = Simulator(graph, comps, lambda w, n: {"lm": 0, "codec": 1}[n], seed=1)
    good, bad = fixture_request("fixture-tts", 4), fixture_request("fixture-tts", 5)
    bad.params.update(fail_node="codec", fail_at=0)
    sim.submit(good)
    sim.submit(bad)
    results = sim.run()
    assert results[good.id].error is None and results[good.id].outputs
    assert "injected failure in codec" in results[bad.id].error


def test_read_counts_follow_the_scopes():

    lm = load_model(ModelRef("fixture-lm")).graph()
    assert index_of(lm.plans["decode"]).once_readers == {("lm", "token"): ["lm"]}  # the carry, once per step
    assert index_of(lm.plans["prefill"]).once_readers == {("lm", "state"): []}  # only a walk output
    nested = index_of(load_model(ModelRef("fixture-nested")).graph().plans["nested"]).once_readers
    assert ("a", "h") not in nested  # read by the inner loop at every inner step: kept
    assert nested[("c", "acc")] == ["a", "c"]


class _PeakValues(Simulator):
    """Records the most values any one walk held after each firing completed."""

    peak = 0

    def _complete(self, ws, *args) -> None:
        super()._complete(ws, *args)
        self.peak = max(self.peak, len(ws.values), len(ws.reads_left))


@pytest.mark.parametrize("futures", [True, False])
def test_a_long_loop_holds_a_bounded_number_of_values(futures):
    """Each step's token is dropped once the next step read it; the outputs still match the reference."""
    from walkserve.core.request import RequestSpec
    from walkserve.core.sampling import SamplingParams
    from walkserve.testing.fixtures.requests import prompt

    graph, comps, ref = setup("fixture-lm")
    sim = _PeakValues(graph, comps, lambda w, n: 0, seed=1, futures=futures)
    request = RequestSpec({"prompt_ids": prompt(1, 4)}, sampling=SamplingParams(max_tokens=300, stop_token_ids=(0,)),
                          params={"eos_at": -1})
    sim.submit(request)
    result = sim.run()[request.id]
    assert len(result.outputs) == 300 and normalized(result) == normalized(ref.run(request))
    assert 2 <= sim.peak <= 4, sim.peak  # inputs + the latest token(s), not 300 of them
