"""The executor on a virtual cluster (random placements, message orders and engine timings) against the reference."""

from __future__ import annotations

import random

import msgspec
import pytest

import walkserve.testing.fixtures as fixtures
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.engines.spec import BuildContext
from walkserve.models.base import ModelRef
from walkserve.models.registry import load_model
from walkserve.protocol import messages as m
from walkserve.testing.fixtures.base import FixtureParams
from walkserve.testing.fixtures.requests import fixture_request, prompt
from walkserve.testing.reference import ReferenceExecutor
from walkserve.testing.simulator import Simulator
from walkserve.worker.outgoing import CONDUCTOR


def setup(family):
    model = load_model(ModelRef(family))
    graph = model.graph()
    comps = {n: s.build(BuildContext(0, "cpu")) for n, s in model.components().items()}
    return graph, comps, ReferenceExecutor(graph, comps)


def normalized(result, walk_outputs=True):
    outs = sorted(((o.modality, o.node, o.path), o.value.tolist()) for o in result.outputs)
    return outs, result.finish, result.walks, result.error, result.walk_outputs if walk_outputs else None


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "alone"])
@pytest.mark.parametrize("family", sorted(fixtures.FIXTURES))
@pytest.mark.parametrize("seed", range(6))
def test_virtual_cluster_matches_reference(family, seed, batched):
    graph, comps, ref = setup(family)
    rng = random.Random(seed)
    n_ranks = 1 + seed % 4
    placement = {n: rng.randrange(n_ranks) for n in graph.node_names()}
    per_walk = seed % 3 == 2  # also place nodes differently per walk (disaggregation)
    walk_salt = {w: rng.randrange(n_ranks) for w in graph.walks}

    def ranks_of(walk, node):
        return (placement[node] + (walk_salt[walk] if per_walk else 0)) % n_ranks

    local_walks = seed % 2 == 0  # walk outputs reach the conductor only when it starts every walk
    sim = Simulator(graph, comps, ranks_of, seed=seed, batched=batched, local_walks=local_walks)
    requests = [fixture_request(family, seed * 10 + i) for i in range(8)]
    for r in requests:
        sim.submit(r)
    results = sim.run()
    for r in requests:
        assert normalized(results[r.id], not local_walks) == normalized(ref.run(r), not local_walks), r.id



@pytest.mark.parametrize("family", sorted(fixtures.FIXTURES))
@pytest.mark.parametrize("seed", range(10))
def test_requests_arriving_while_others_run_match_the_reference(family, seed):
    """Half the requests arrive at random steps of the others' run, so their loop instances join cohorts whose
    members are anywhere in an iteration, their last included (a joiner once waited for ever behind a member that
    ended instead of starting a next step)."""
    graph, comps, ref = setup(family)
    rng = random.Random(seed)
    n_ranks = 1 + seed % 3
    placement = {n: rng.randrange(n_ranks) for n in graph.node_names()}
    sim = Simulator(graph, comps, lambda walk, node: placement[node], seed=seed)
    requests = [fixture_request(family, 100 + seed * 10 + i) for i in range(8)]
    for i, r in enumerate(requests):
        sim.submit(r) if i % 2 == 0 else sim.arrive(r)
    results = sim.run()
    for r in requests:
        assert normalized(results[r.id], False) == normalized(ref.run(r), False), r.id

def test_loop_that_stops_at_k_yields_exactly_k_outputs_after_k_plus_one_steps():
    graph, comps, _ref = setup("fixture-lm")
    for k in range(0, 9):
        for batched, groups in ((True, 1.0), (False, 0.0), (True, 0.0)):
            sim = Simulator(graph, comps, lambda w, n: 0, seed=k, batched=batched, groups=groups)
            spec = RequestSpec({"prompt_ids": prompt(k, 3)}, sampling=SamplingParams(max_tokens=20), params=FixtureParams(eos_at=k))
            sim.submit(spec)
            res = sim.run()[spec.id]
            assert len(res.stream("text")) == k  # the EOS iteration itself is not exposed
            assert sim.firings() == 1 + k + 1  # the prefill, then k + 1 decode steps: nothing ran ahead


def test_component_failure_fails_only_that_request():
    graph, comps, _ = setup("fixture-tts")
    sim = Simulator(graph, comps, lambda w, n: {"lm": 0, "codec": 1}[n], seed=1)
    good, bad = fixture_request("fixture-tts", 4), fixture_request("fixture-tts", 5)
    bad.params = msgspec.structs.replace(bad.params, fail_node="codec", fail_at=0)
    sim.submit(good)
    sim.submit(bad)
    results = sim.run()
    assert results[good.id].error is None and results[good.id].outputs
    assert "injected failure in codec" in results[bad.id].error
    assert all(not ex.requests for ex in sim.executors.values())  # both released everywhere


def test_a_prefill_then_decode_on_one_rank_needs_no_conductor_round_trip():
    graph, comps, ref = setup("fixture-lm")
    requests = [fixture_request("fixture-lm", i) for i in range(10)]
    two_walks = [r for r in requests if len(r.inputs["prompt_ids"].tolist()) > 1]
    for local_walks in (True, False):
        sim = Simulator(graph, comps, lambda w, n: 0, seed=2, local_walks=local_walks)
        for r in requests:
            sim.submit(r)
        results = sim.run()
        for r in requests:
            assert normalized(results[r.id], False) == normalized(ref.run(r), False)
        if local_walks:  # one StartWalk per request; the worker went from prefill to decode itself
            assert sim.stats.start_walks == len(requests) and sim.stats.walks_started_by_workers == len(two_walks)
        else:
            assert sim.stats.start_walks == len(requests) + len(two_walks)


class _Peak(Simulator):
    """Records the most values any member held (this and the last iteration, values for later ones)."""

    peak = 0

    def _tick(self, rank: int) -> None:
        super()._tick(rank)
        for req in self.executors[rank].requests.values():
            for run in req.walks.values():
                for mem in run.members.values():
                    held = len(mem.cur) + len(mem.prev) + len(mem.ahead or {}) + len(mem.entry)
                    self.peak = max(self.peak, held)


def test_a_long_loop_holds_a_bounded_number_of_values():
    """A member keeps one iteration's values and the previous one's (the carries), not one per step."""
    graph, comps, ref = setup("fixture-lm")
    sim = _Peak(graph, comps, lambda w, n: 0, seed=1)
    request = RequestSpec({"prompt_ids": prompt(1, 4)}, sampling=SamplingParams(max_tokens=300, stop_token_ids=(0,)),
                          params=FixtureParams(eos_at=-1))
    sim.submit(request)
    result = sim.run()[request.id]
    assert len(result.outputs) == 300 and normalized(result, False) == normalized(ref.run(request), False)
    assert 2 <= sim.peak <= 4, sim.peak  # inputs + the latest token(s), not 300 of them


class _Echo:
    """lm: token = tokens + 1."""

    def forward_batch(self, batch):
        return [{"token": f.inputs["tokens"] + 1} for f in batch]


def test_a_walk_input_handed_on_reaches_the_next_walk_the_worker_starts():
    """``input.step -> output.step`` on walks a rank runs back to back itself: the state machine there gets
    the step back, and the conductor gets every walk's outputs."""
    from walkserve.core.array import ArrayData
    from walkserve.graph import (
        Client,
        FunctionStateMachine,
        GraphEdge,
        GraphNode,
        Walk,
        WalkGraph,
        WalkStart,
    )

    walk = Walk("piece", GraphNode("lm", ["tokens"], ["token"]),
                edges=[GraphEdge("input.tokens", "lm.tokens"), GraphEdge("lm.token", Client("text")),
                       GraphEdge("input.step", "output.step")], inputs=["tokens", "step"], outputs=["step"])

    def piece(step: int) -> WalkStart:
        return WalkStart("piece", {"tokens": ArrayData.from_list([10 * step]), "step": ArrayData.from_list([step])})

    def next_walk(request, finished, outputs):
        step = outputs["step"].tolist()[0]
        return piece(step + 1) if step < 3 else None

    graph = WalkGraph("pieces", [walk], FunctionStateMachine(lambda r: piece(0), next_walk))
    for local_walks in (True, False):
        sim = Simulator(graph, {"lm": _Echo()}, lambda w, n: 0, seed=1, local_walks=local_walks)
        spec = RequestSpec({}, id="r")
        sim.submit(spec)
        res = sim.run()["r"]
        assert res.error is None and [o.value.tolist() for o in res.outputs] == [[1], [11], [21], [31]]
        assert sim.stats.walks_started_by_workers == (3 if local_walks else 0)
        assert sim.stats.start_walks == (1 if local_walks else 4)


class _Rows(Simulator):
    """Records the rows of every Values message one rank sends another."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows: list[tuple[str, int]] = []  # (node, rows) per message

    def _flush(self, rank: int) -> None:
        for dest, msg in self.executors[rank].out.take():
            if isinstance(msg, m.Values):
                self.rows.append((msg.node, len(msg.request_ids)))
            if dest != CONDUCTOR:
                self.stats.messages += 1
            self.channels[(("rank", rank), dest)].append(msg)


@pytest.mark.parametrize("seed", range(3))
def test_a_step_handed_to_another_rank_goes_in_two_halves_with_the_same_outputs(seed):
    """``split_steps``: the 12 members' step of a (read by b on the other rank) leaves as two messages of at
    most 6 rows, so rank 1 can run b on the first half while rank 0 runs a on the second; outputs unchanged."""
    graph, comps, ref = setup("fixture-nested")
    place = {"a": 0, "b": 1, "c": 0}
    requests = [fixture_request("fixture-nested", seed * 100 + i) for i in range(12)]
    seen = {}
    for split in (0, 4):
        sim = _Rows(graph, comps, lambda w, n: place[n], seed=seed, groups=1.0, split_steps=split)
        for r in requests:
            sim.submit(r)
        results = sim.run()
        for r in requests:
            assert normalized(results[r.id]) == normalized(ref.run(r)), r.id
        seen[split] = (max(n for node, n in sim.rows if node == "a"), sim.executors[0].counters["split_steps"])
    assert seen[0][0] > 6 and seen[0][1] == 0  # without it, a step of a leaves whole
    assert seen[4][0] <= 6 and seen[4][1] > 0
