"""Cohorts: every request's instance of a loop stepped together, with the semantics of one iteration at a time.

The executor is driven by hand here (no threads, no processes): StartWalk
messages in, passes, messages out.
"""

from __future__ import annotations

import time

import pytest
import torch

from walkserve.core.params import Params
from walkserve.core.sampling import SamplingParams
from walkserve.engines.base import LATER, Engine, Group
from walkserve.engines.values import concat
from walkserve.graph import (
    Client,
    DynamicLoop,
    FunctionStateMachine,
    GraphEdge,
    GraphNode,
    Sequential,
    StopWhen,
    Walk,
    WalkGraph,
    WalkStart,
)
from walkserve.graph.compose import ACCUMULATE, LAST
from walkserve.protocol import messages as m
from walkserve.testing.simulator import GroupOnlyEngine
from walkserve.worker.executor import Executor


class LoopParams(Params, frozen=True, tag="test.cohort"):
    steps: int = 1
    stop_at: int | None = None
    bad_rule: int | None = None


def stop_rule(value, params, k):
    if params.model.bad_rule == k:
        raise RuntimeError("rule broke")
    return params.model.stop_at == k


def _graph(b_params: dict | None = None) -> WalkGraph:
    loop = DynamicLoop(
        Sequential(GraphNode("a", ["x", "bias"], ["y"]), GraphNode("b", ["y"], ["x"], params=b_params or {})),
        stop=StopWhen("b.x", stop_rule, include_stopping=False, label="stop_at"),
        max_iterations="steps",
        carry={"b.x": "a.x"},
        outputs={"b.x": LAST, "a.y": ACCUMULATE},
        name="L",
    )
    walk = Walk(
        "w",
        loop,
        [
            GraphEdge("input.x", "a.x"),
            GraphEdge("input.bias", "a.bias"),
            GraphEdge("a.y", "b.y"),
            GraphEdge("b.x", Client("text")),
            GraphEdge("b.x", "output.last"),
            GraphEdge("a.y", "output.ys"),
        ],
        inputs=["x", "bias"],
        outputs=["last", "ys"],
    )
    return WalkGraph("t", [walk], FunctionStateMachine(lambda req: WalkStart("w", {})))


class AddBias(GroupOnlyEngine):
    """a: y = x + bias for a whole group in one call (``run_group``)."""

    component = "a"

    def __init__(self, fail_for: str | None = None, raise_on_call: int | None = None, omit_for: str | None = None):
        self.calls: list[list[str]] = []
        self.fail_for, self.raise_on_call, self.omit_for = fail_for, raise_on_call, omit_for

    def run_group(self, group: Group) -> list:
        self.calls.append(list(group.request_ids))
        if self.raise_on_call == len(self.calls):
            raise RuntimeError("device lost")
        return [
            "bad input" if rid == self.fail_for else {} if rid == self.omit_for else {"y": inp["x"] + inp["bias"]}
            for rid, inp in zip(group.request_ids, group.inputs, strict=True)
        ]


class Copy(Engine):
    """b: x = y, each member answered one call after its first offer (``LATER`` first, as a long prefill is):
    the member waits for its result over a pass."""

    component = "b"

    def __init__(self, fail_for: str | None = None, raise_on_step: bool = False):
        self.queue: dict[tuple, dict] = {}  # (request, path) in flight -> its inputs
        self.fail_for, self.raise_on_step = fail_for, raise_on_step
        self.firings = 0

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list:
        if self.raise_on_step:
            raise RuntimeError("boom")
        out = []
        for g in groups:
            results = []
            for rid, path, inp in zip(g.request_ids, g.paths, g.inputs, strict=True):
                if may_yield and (rid, path) not in self.queue:
                    self.queue[(rid, path)] = inp
                    results.append(LATER)
                    continue
                self.queue.pop((rid, path), None)
                self.firings += 1
                results.append("b refused" if rid == self.fail_for else {"x": inp["y"]})
            out.append(results)
        return out

    def release(self, request_id: str) -> None:
        self.queue = {k: v for k, v in self.queue.items() if k[0] != request_id}


def _executor(a: Engine | None = None, b: Engine | None = None) -> tuple[Executor, AddBias, Copy]:
    a, b = a or AddBias(), b or Copy()
    return Executor(0, _graph(), {"a": a, "b": b}, concat), a, b


def _start(ex: Executor, rid: str, x: int, bias: int, steps: int, **params: int) -> None:
    ex.receive(_walk(rid, x, bias, steps, **params))


def _walk(rid: str, x: int, bias: int, steps: int, **params: int) -> m.StartWalk:
    inputs = {"x": torch.tensor([x]), "bias": torch.tensor([bias])}
    return m.StartWalk(rid, "w", {"a": 0, "b": 0}, inputs, LoopParams(steps=steps, **params), SamplingParams())


def _drive(ex: Executor, limit: int = 1000) -> list:
    """Passes until nothing moves; every message sent."""
    sent = []
    for _ in range(limit):
        moved = ex.advance()
        sent += ex.out.take()
        if not moved:
            return sent
    raise AssertionError("the executor did not settle")


def _until(ex: Executor, done, limit: int = 20) -> None:
    for _ in range(limit):
        if done():
            return
        ex.advance()
    raise AssertionError("never got there")


def _client(sent) -> dict[str, list]:
    out: dict[str, list] = {}
    for _, msg in sent:
        if isinstance(msg, m.ClientOuts):
            for rid, path, v in zip(msg.request_ids, msg.paths, msg.values, strict=True):
                out.setdefault(rid, []).append((tuple(path), int(v)))
    return out


def _kinds(sent, kind) -> list:
    return [msg for _, msg in sent if isinstance(msg, kind)]


def test_members_step_together_and_only_exposed_iterations_leave():
    ex, a, b = _executor()
    _start(ex, "stops", 1, 10, steps=8, stop_at=2)  # iteration 2 decides to stop: 2 exposed
    _start(ex, "bound", 0, 1, steps=4)  # runs into its bound: 4 exposed, hit_bound
    _start(ex, "first", 5, 5, steps=8, stop_at=0)  # stops at once: nothing exposed
    sent = _drive(ex)
    client = _client(sent)
    assert client["stops"] == [((0,), 11), ((1,), 21)]
    assert client["bound"] == [((0,), 1), ((1,), 2), ((2,), 3), ((3,), 4)]
    assert "first" not in client
    outs = {(w.request_id, w.name): w.value for w in _kinds(sent, m.WalkOut)}
    assert outs[("stops", "last")].tolist() == [21] and outs[("stops", "ys")].tolist() == [11, 21]
    assert outs[("bound", "ys")].tolist() == [1, 2, 3, 4]
    done = {d.request_id: (d.firings, d.hit_bound) for d in _kinds(sent, m.NodeDone)}
    assert done == {"stops": (6, False), "bound": (8, True)}
    assert [f.request_id for f in _kinds(sent, m.Failed)] == ["first"]  # no last value of b.x: nothing exposed
    # one group call per step for every live member; b saw one firing per member and iteration
    assert a.calls[0] == ["stops", "bound", "first"] and a.calls[1] == ["stops", "bound"] and len(a.calls) == 4
    assert b.firings == 3 + 4 + 1
    assert ex.counters["firings"] == 2 * (3 + 4 + 1)


def test_a_late_member_joins_the_next_step():
    ex, a, b = _executor()
    _start(ex, "early", 0, 1, steps=3)
    _until(ex, lambda: b.queue)  # a ran as a group; b's member is in flight
    _start(ex, "late", 100, 1, steps=2)
    client = _client(_drive(ex))
    assert [v for _, v in client["early"]] == [1, 2, 3]
    assert [v for _, v in client["late"]] == [101, 102]
    assert a.calls == [["early"], ["early", "late"], ["early", "late"]]


def test_a_member_joining_while_the_last_one_ends_its_last_iteration_is_admitted():
    """A member that joins while the cohort's only other member is inside its *last* iteration: that member ends
    instead of starting a next step (no step boundary), and the joiner is admitted at the next pass (it waited
    in ``joining`` for ever: a plan joining the CEM loop as another plan's last iteration ran hung)."""
    ex, a, _ = _executor()
    _start(ex, "ending", 0, 1, steps=1)
    ex.advance()  # its loop instance is to join the loop's cohort: the next pass admits it and runs a, b waits
    _start(ex, "late", 100, 1, steps=2)  # ... and, in the same pass, this one's instance joins behind it
    client = _client(_drive(ex))
    assert [v for _, v in client["ending"]] == [1]
    assert [v for _, v in client["late"]] == [101, 102]
    assert a.calls == [["ending"], ["late"], ["late"]]


class GroupOnlyCopy(GroupOnlyEngine):
    """b: x = y, a whole group at once."""

    component = "b"

    def run_group(self, group: Group) -> list:
        return [{"x": inp["y"]} for inp in group.inputs]


def _two_ranks() -> dict[int, Executor]:
    """The loop split: a on rank 0, b (and the stop rule) on rank 1, which decides every iteration."""
    graph = _graph()
    return {r: Executor(r, graph, {"a": AddBias(), "b": GroupOnlyCopy()}, concat) for r in (0, 1)}


def _start_split(exs: dict[int, Executor], rid: str, x: int, steps: int, **params: int) -> None:
    inputs = {"x": torch.tensor([x]), "bias": torch.tensor([1])}
    for ex in exs.values():
        ex.receive(m.StartWalk(rid, "w", {"a": 0, "b": 1}, inputs, LoopParams(steps=steps, **params), SamplingParams()))


def _route(exs: dict[int, Executor], hold=lambda msg: False) -> tuple[list, list]:
    """Passes on both ranks, their messages to each other, until nothing moves: (what reached the conductor,
    the messages ``hold`` kept back)."""
    conductor, held = [], []
    for _ in range(1000):
        moved = [ex.advance() for ex in exs.values()]
        sent = [(dest, msg) for ex in exs.values() for dest, msg in ex.out.take()]
        for dest, msg in sent:
            if dest == "conductor":
                conductor.append(msg)
            elif hold(msg):
                held.append((dest[1], msg))
            else:
                exs[dest[1]].receive(msg)
        if not any(moved) and not sent:
            return conductor, held
    raise AssertionError("the ranks did not settle")


def _rows(sent: list) -> list[tuple]:
    """(request, path, value) of every client row in ``sent`` (conductor messages), in order."""
    return [(rid, tuple(p), int(v)) for msg in sent if isinstance(msg, m.ClientOuts)
            for rid, p, v in zip(msg.request_ids, msg.paths, msg.values, strict=True)]


def test_a_member_another_rank_ends_outside_a_pass_lets_the_members_that_joined_behind_it_in():
    """Rank 1 decides that "ending"'s iteration 1 is not exposed while rank 0 waits for that decision at the end of
    it, with "late" joining behind it: the decision ends the member outside a pass of rank 0's cohort, which still
    passes again and admits "late" (nothing from rank 1 wakes it: its first step reads nothing from there)."""
    exs = _two_ranks()
    _start_split(exs, "ending", 0, steps=8, stop_at=1)
    first, held = _route(exs, hold=lambda msg: isinstance(msg, m.LoopEvents) and msg.ends[0] >= 0)
    assert [msg.ks for _, msg in held] == [[1]]  # rank 0 waits for it
    _start_split(exs, "late", 100, steps=2)
    _route(exs)
    for rank, msg in held:
        exs[rank].receive(msg)
    sent = first + _route(exs)[0]
    rows = _rows(sent)
    assert [r for r in rows if r[0] == "ending"] == [("ending", (0,), 1)]
    assert [r for r in rows if r[0] == "late"] == [("late", (0,), 101), ("late", (1,), 102)]
    assert {(d.request_id, tuple(d.nodes)) for d in sent if isinstance(d, m.NodeDone)} == {
        ("ending", ("a",)), ("ending", ("b",)), ("late", ("a",)), ("late", ("b",))}


def test_a_request_failed_outside_a_pass_lets_the_members_that_joined_behind_it_in():
    """As above, but "ending" fails on rank 0 from elsewhere (as a stream overflow or a context that could not move
    fail it) and is released: its cohort still passes again and admits "late" (the release alone found no member
    left to stop)."""
    exs = _two_ranks()
    _start_split(exs, "ending", 0, steps=8, stop_at=1)
    _route(exs, hold=lambda msg: isinstance(msg, m.LoopEvents) and msg.ends[0] >= 0)  # rank 0 waits for the decision
    _start_split(exs, "late", 100, steps=2)
    _route(exs)
    exs[0].fx.fail(exs[0].requests["ending"].walks["w"], "lost")
    for ex in exs.values():
        ex.receive(m.Release("ending"))
    sent = _route(exs)[0]
    rows = _rows(sent)
    assert rows == [("late", (0,), 101), ("late", (1,), 102)]
    assert [f.request_id for f in sent if isinstance(f, m.Failed)] == ["ending"]


def test_release_while_a_firing_is_pending_lets_the_others_finish():
    ex, _, b = _executor()
    _start(ex, "r1", 0, 1, steps=3)
    _start(ex, "r2", 0, 2, steps=3)
    _until(ex, lambda: len(b.queue) == 2)
    ex.receive(m.Release("r1"))
    assert len(b.queue) == 1 and ex.stats().inflight == 1
    sent = _drive(ex)
    assert set(_client(sent)) == {"r2"} and {d.request_id for d in _kinds(sent, m.NodeDone)} == {"r2"}
    assert not _kinds(sent, m.Failed) and not ex.stats().inflight


@pytest.mark.parametrize("where", ["group", "firing"])
def test_an_engine_error_fails_that_member_only(where):
    a = AddBias(fail_for="r2" if where == "group" else None)
    b = Copy(fail_for="r2" if where == "firing" else None)
    ex, _, _ = _executor(a, b)
    for rid in ("r1", "r2", "r3"):
        _start(ex, rid, 0, 1, steps=2)
    sent = _drive(ex)
    assert [(f.request_id, f.error) for f in _kinds(sent, m.Failed)] == [("r2", "bad input" if where == "group" else "b refused")]
    assert {d.request_id for d in _kinds(sent, m.NodeDone)} == {"r1", "r3"}
    assert "r2" not in _client(sent)


def test_an_output_an_engine_left_out_fails_the_member_that_needs_it():
    ex, _, _ = _executor(AddBias(omit_for="r2"))
    _start(ex, "r1", 0, 1, steps=2)
    _start(ex, "r2", 0, 1, steps=2)
    sent = _drive(ex)
    assert {f.request_id: f.error for f in _kinds(sent, m.Failed)} == {"r2": "node 'a' returned no output 'y', which node 'b' reads"}
    assert {d.request_id for d in _kinds(sent, m.NodeDone)} == {"r1"}


def test_a_failing_stop_rule_fails_that_member_and_keeps_its_earlier_outputs():
    ex, _, _ = _executor()
    _start(ex, "ok", 0, 1, steps=3)
    _start(ex, "bad", 0, 1, steps=3, bad_rule=1)
    sent = _drive(ex)
    assert {f.request_id: f.error for f in _kinds(sent, m.Failed)} == {"bad": "stop rule of loop 'L' failed: RuntimeError: rule broke"}
    assert [p for p, _ in _client(sent)["bad"]] == [(0,)]  # iteration 0 counted before the rule broke
    kinds = [type(msg).__name__ for _, msg in sent if "bad" in getattr(msg, "request_ids", ()) or getattr(msg, "request_id", "") == "bad"]
    assert kinds.index("ClientOuts") < kinds.index("Failed")


def test_a_group_call_that_raises_fails_the_members_in_it():
    ex, _, _ = _executor(AddBias(raise_on_call=2))
    _start(ex, "r1", 0, 1, steps=3)
    _start(ex, "r2", 0, 1, steps=3)
    failed = {f.request_id: f.error for f in _kinds(_drive(ex), m.Failed)}
    assert set(failed) == {"r1", "r2"} and "device lost" in failed["r1"]
    _start(ex, "r3", 0, 1, steps=1)  # a member that joins afterwards runs normally
    assert {d.request_id for d in _kinds(_drive(ex), m.NodeDone)} == {"r3"}


def test_an_engine_that_fails_a_step_fails_the_members_waiting_on_it():
    ex, _, _ = _executor(b=Copy(raise_on_step=True))
    _start(ex, "r1", 0, 1, steps=3)
    sent = _drive(ex)
    assert [(f.request_id, f.error) for f in _kinds(sent, m.Failed)] == [("r1", "engine 'b' failed: RuntimeError: boom")]
    assert not _kinds(sent, m.NodeDone) and not ex.stats().inflight


def test_cohorts_off_steps_each_request_alone_with_the_same_results():
    batched, a1, _ = _executor()
    alone = Executor(0, _graph(), {"a": (a2 := AddBias()), "b": Copy()}, concat, batched=False)
    for ex in (batched, alone):
        for i in range(3):
            _start(ex, f"r{i}", i, 1, steps=2 + i)
    assert _client(_drive(batched)) == _client(_drive(alone))
    assert max(len(c) for c in a1.calls) == 3 and max(len(c) for c in a2.calls) == 1


class SlowAddBias(AddBias):
    def run_group(self, group: Group) -> list:
        time.sleep(0.002)
        return super().run_group(group)


def test_a_cohorts_group_runs_count_as_its_engines_busy_time():
    """The stats' busy seconds per component include the groups a cohort runs, not only the engine steps."""
    ex, a, b = _executor(SlowAddBias())
    for i in range(3):
        _start(ex, f"r{i}", i, 1, steps=4)
    sent = _drive(ex)
    assert {d.request_id for d in _kinds(sent, m.NodeDone)} == {"r0", "r1", "r2"}
    assert ex.steps["a"] == len(a.calls) == 4  # one group call per step, all three members in each
    assert ex.items["a"] == sum(len(c) for c in a.calls) == 12
    assert ex.busy_s["a"] >= 0.002 * len(a.calls)
    assert ex.items["b"] == b.firings == 12  # b's members count when answered, not when answered LATER
    stats = ex.stats()
    assert stats.steps["a"] == 4 and stats.busy_s["a"] >= 0.008


def test_each_node_gets_its_own_sampling_when_the_request_names_it():
    """Per-node sampling: node a samples with its own params, node b with the request's."""
    seen: dict[str, list] = {"a": [], "b": []}

    class RecordA(AddBias):
        def run_group(self, group: Group) -> list:
            seen["a"] += [s.temperature for s in group.sampling]
            return super().run_group(group)

    class RecordB(Copy):
        def run_groups(self, groups: list[Group], may_yield: bool = False) -> list:
            for g in groups:  # each member once, at its first offer
                seen["b"] += [s.temperature for rid, path, s in zip(g.request_ids, g.paths, g.sampling, strict=True)
                              if (rid, path) not in self.queue]
            return super().run_groups(groups, may_yield)

    ex, _, _ = _executor(RecordA(), RecordB())
    walk = _walk("r", 1, 2, steps=2)
    walk.sampling, walk.node_sampling = SamplingParams(temperature=0.5), {"a": SamplingParams(temperature=0.9)}
    ex.receive(walk)
    _drive(ex)
    assert seen == {"a": [0.9, 0.9], "b": [0.5, 0.5]}


class Passes(GroupOnlyEngine):
    """Two guidance-like passes ``p1``/``p2`` of one component: records how the cohort called it."""

    component = "p"

    def __init__(self):
        self.calls: list[list[tuple[str, list[str]]]] = []  # per engine call: (node, members) per group

    def run_group(self, group: Group) -> list:
        return self.run_groups([group])[0]

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list:
        self.calls.append([(g.node, list(g.request_ids)) for g in groups])
        scale = {"p1": 1, "p2": 10}
        return [[{"v": inp["x"] * scale[g.node]} for inp in g.inputs] for g in groups]


class Combine(GroupOnlyEngine):
    component = "c"

    def run_group(self, group: Group) -> list:
        return [{"x": inp["a"] + inp["b"]} for inp in group.inputs]


def test_independent_nodes_of_one_engine_run_in_one_call_per_step():
    """Like a CFG step: two passes read the carried latent, a combine reads both; each step calls the
    passes' engine once for both nodes and every member."""
    body = Sequential(GraphNode("p1", ["x"], ["v"], component="p"), GraphNode("p2", ["x"], ["v"], component="p"),
                      GraphNode("c", ["a", "b"], ["x"]))
    loop = DynamicLoop(body, stop=StopWhen("c.x", stop_rule, label="stop_at"), max_iterations="steps",
                       carry={"c.x": ["p1.x", "p2.x"]}, outputs={"c.x": LAST}, name="L")
    walk = Walk("w", loop, [GraphEdge("input.x", "p1.x"), GraphEdge("input.x", "p2.x"), GraphEdge("p1.v", "c.a"),
                            GraphEdge("p2.v", "c.b"), GraphEdge("c.x", "output.last")], inputs=["x"], outputs=["last"])
    graph = WalkGraph("t", [walk], FunctionStateMachine(lambda req: WalkStart("w", {})))
    passes = Passes()
    ex = Executor(0, graph, {"p": passes, "c": Combine()}, concat)
    for rid, x in (("r1", 1), ("r2", 2)):
        ex.receive(m.StartWalk(rid, "w", {"p1": 0, "p2": 0, "c": 0}, {"x": torch.tensor([x])}, LoopParams(steps=3),
                               SamplingParams()))
    sent = _drive(ex)
    assert passes.calls == [[("p1", ["r1", "r2"]), ("p2", ["r1", "r2"])]] * 3
    assert {w.request_id: w.value.tolist() for w in _kinds(sent, m.WalkOut)} == {"r1": [1331], "r2": [2662]}


class CopyModule:
    """b's component for a StatelessEngine: x = y, recording each batch's requests."""

    def __init__(self):
        self.batches: list[list[str]] = []

    def forward_batch(self, firings: list) -> list[dict]:
        self.batches.append([f.request_id for f in firings])
        return [{"x": f.inputs["y"]} for f in firings]


def test_a_gathering_engine_batches_the_members_of_every_cohort_in_one_call():
    """A stateless engine gathers: with loop cohorts off each request steps in its own cohort, and still every
    member of a pass runs in one forward_batch (after the pass), with the same results as one cohort."""
    from walkserve.engines.stateless import StatelessEngine

    module, alone_module = CopyModule(), CopyModule()
    batched = Executor(0, _graph(), {"a": AddBias(), "b": StatelessEngine("b", module)}, concat)
    alone = Executor(0, _graph(), {"a": (a := AddBias()), "b": StatelessEngine("b", alone_module)}, concat, batched=False)
    for ex in (batched, alone):
        for i in range(3):
            _start(ex, f"r{i}", i, 1, steps=2)
    sent = _drive(alone)
    assert max(len(c) for c in a.calls) == 1  # a's groups: one cohort per request
    assert alone_module.batches == [["r0", "r1", "r2"]] * 2  # one batch per step, all three cohorts in it
    assert _client(sent) == _client(_drive(batched)) and module.batches == alone_module.batches
    assert {d.request_id for d in _kinds(sent, m.NodeDone)} == {"r0", "r1", "r2"}
    node = alone.stats().nodes["b"]
    assert node["batches"] == 2 and node["items"] == 6


class KVCopy(Copy):
    """``Copy`` on a KV-contexts engine: records each offered member's bound context operations."""

    kv_contexts = True

    def __init__(self):
        super().__init__()
        self.kv: list = []

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list:
        self.kv += [kv for g in groups for kv in g.kv]
        return super().run_groups(groups, may_yield)


def test_a_member_answered_later_is_offered_again_without_binding_its_context_operations_again():
    """The engine goes on with the firing it bound at the member's first offer, so the worker does not bind it
    again at every pass (a CEM plan's fan of 4096 candidates bound 8192 operations, ~70 ms, in each)."""
    from walkserve.graph.kv import append, kv_params

    b = KVCopy()
    ex = Executor(0, _graph(kv_params(append("main", tokens="y"))), {"a": AddBias(), "b": b}, concat)
    _start(ex, "r", 1, 2, steps=2)
    sent = _drive(ex)
    assert _client(sent)["r"] == [((0,), 3), ((1,), 5)]
    assert [None if kv is None else [op.token_ids.tolist() for op in kv] for kv in b.kv] == [[[3]], None, [[5]], None]
