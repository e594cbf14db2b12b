"""Loop cohorts: many requests' instances of one loop stepped together, with the semantics of one firing per iteration."""

from __future__ import annotations

import itertools
import time

import pytest

from walkserve.engines.base import Engine, Firing, FiringResult, Group
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
from walkserve.testing.simulator import GroupOnlyEngine
from walkserve.worker.cohort import Cohort, Member
from walkserve.worker.cohort_plan import CARRIED, CUR, FIXED
from walkserve.worker.compute import ComputeThread
from walkserve.worker.future import FAILED, READY, Future
from walkserve.worker.plan_index import index_of


def stop_rule(value, params, k):
    if params.get("bad_rule") == k:
        raise RuntimeError("rule broke")
    return params.get("stop_at") == k


def _plan():
    loop = DynamicLoop(
        Sequential(GraphNode("a", ["x", "bias"], ["y"]), GraphNode("b", ["y"], ["x"])),
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
    graph = WalkGraph("t", [walk], FunctionStateMachine(lambda req: WalkStart("w", {})))
    return index_of(graph.plans["w"]).cohorts["L"]


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
    """b: x = y, one ordinary firing at a time (no ``run_group``): the cohort submits and waits."""

    component = "b"

    def __init__(self, fail_for: str | None = None):
        self.queue: list[Firing] = []
        self.fail_for = fail_for
        self.firings = 0

    def submit(self, firing: Firing) -> None:
        self.queue.append(firing)

    def has_work(self) -> bool:
        return bool(self.queue)

    def step(self) -> list[FiringResult]:
        out = []
        for f in self.queue:
            self.firings += 1
            if f.request_id == self.fail_for:
                out.append(FiringResult(f, error="b refused"))
            else:
                out.append(FiringResult(f, outputs={"x": f.inputs["y"]}))
        self.queue = []
        return out

    def release(self, request_id: str) -> None:
        self.queue = [f for f in self.queue if f.request_id != request_id]


def _member(rid: str, x: int, bias: int, steps: int, **params) -> Member:
    return Member(rid, (), steps, {"steps": steps, **params}, None, {("a", "x"): x, ("a", "bias"): bias})


def _run(cohort: Cohort, b: Copy, limit: int = 100) -> list:
    """Drive the cohort the way the compute thread does; every step's report."""
    reports = []
    for _ in range(limit):
        report = cohort.advance()
        if report is not None:
            reports.append(report)
        elif b.has_work():
            for r in b.step():
                cohort.on_result(r)
        elif not cohort.has_work():
            return reports
    raise AssertionError("the cohort did not finish")


def _cohort(a: Engine | None = None, b: Engine | None = None) -> tuple[Cohort, Engine, Engine]:
    a, b = a or AddBias(), b or Copy()
    ids = itertools.count(-1, -1)
    return Cohort(_plan(), {"a": a, "b": b}, lambda cohort: next(ids)), a, b


def _client(reports) -> dict[str, list]:
    out: dict[str, list] = {}
    for rep in reports:
        for (node, output, modality), (rids, paths, values) in rep.client.items():
            assert (node, output, modality) == ("b", "x", "text")
            for rid, path, v in zip(rids, paths, values, strict=True):
                out.setdefault(rid, []).append((path, v))
    return out


def _ended(reports) -> dict[str, tuple]:
    return {e[0]: e[1:] for rep in reports for e in rep.ended}


def test_plan_reads_carries_invariants_and_exits():
    cp = _plan()
    assert cp.nodes == ("a", "b")
    assert cp.slots["a"] == (("x", CARRIED, ("a", "x"), None), ("bias", FIXED, ("a", "bias"), None))
    assert cp.slots["b"] == (("y", CUR, "a", "y"),)
    assert cp.carries == ((("a", "x"), "b", "x"),)
    assert sorted((n, o, last) for n, o, _, last in cp.exits) == [("a", "y", False), ("b", "x", True)]
    assert cp.client == (("b", "x", "text"),)


def test_members_step_together_and_only_exposed_iterations_leave():
    cohort, a, b = _cohort()
    cohort.join(_member("stops", 1, 10, steps=8, stop_at=2))  # iteration 2 decides to stop: 2 exposed
    cohort.join(_member("bound", 0, 1, steps=4))  # runs into its bound: 4 exposed, hit_bound
    cohort.join(_member("first", 5, 5, steps=8, stop_at=0))  # stops at once: nothing exposed
    reports = _run(cohort, b)
    client = _client(reports)
    assert client["stops"] == [((0,), 11), ((1,), 21)]
    assert client["bound"] == [((0,), 1), ((1,), 2), ((2,), 3), ((3,), 4)]
    assert "first" not in client
    ended = _ended(reports)
    exits = {rid: {type(r).__name__ + ":" + (getattr(r, "name", None) or ""): v for r, v in e[4]} for rid, e in ended.items()}
    assert ended["stops"][:4] == ((), 2, 3, False)  # outer, exposed, fired, hit bound
    assert ended["bound"][:4] == ((), 4, 4, True)
    assert ended["first"][:4] == ((), 0, 1, False)
    assert exits["stops"] == {"ToOutput:last": [21], "ToOutput:ys": [11, 21]}
    assert exits["first"] == {"ToOutput:last": [], "ToOutput:ys": []}
    # one group call per step for every live member; b saw one firing per member and iteration
    assert a.calls[0] == ["stops", "bound", "first"] and a.calls[1] == ["stops", "bound"] and len(a.calls) == 4
    assert b.firings == 3 + 4 + 1
    assert sum(r.firings for r in reports) == 2 * (3 + 4 + 1)


def test_a_late_member_joins_the_next_step():
    cohort, a, b = _cohort()
    cohort.join(_member("early", 0, 1, steps=3))
    assert cohort.advance() is None  # a ran as a group; b's firing is pending
    cohort.join(_member("late", 100, 1, steps=2))
    reports = _run(cohort, b)
    client = _client(reports)
    assert [v for _, v in client["early"]] == [1, 2, 3]
    assert [v for _, v in client["late"]] == [101, 102]
    assert a.calls == [["early"], ["early", "late"], ["early", "late"]]


def test_release_while_a_firing_is_pending_lets_the_others_finish():
    cohort, _, b = _cohort()
    cohort.join(_member("r1", 0, 1, steps=3))
    cohort.join(_member("r2", 0, 2, steps=3))
    assert cohort.advance() is None and len(b.queue) == 2
    cohort.release("r1")
    b.release("r1")  # the engine drops its firing: no result will ever come
    reports = _run(cohort, b)
    assert set(_client(reports)) == {"r2"} and set(_ended(reports)) == {"r2"}
    assert not any(rep.failed for rep in reports)


@pytest.mark.parametrize("where", ["group", "firing"])
def test_an_engine_error_fails_that_member_only(where):
    a = AddBias(fail_for="r2" if where == "group" else None)
    b = Copy(fail_for="r2" if where == "firing" else None)
    cohort, _, _ = _cohort(a, b)
    for rid in ("r1", "r2", "r3"):
        cohort.join(_member(rid, 0, 1, steps=2))
    reports = _run(cohort, b)
    failed = [f for rep in reports for f in rep.failed]
    assert failed == [("r2", "bad input" if where == "group" else "b refused")]
    assert set(_ended(reports)) == {"r1", "r3"}
    assert "r2" not in _client(reports)


def test_an_output_an_engine_left_out_fails_the_member_that_needs_it():
    cohort, _, b = _cohort(AddBias(omit_for="r2"))
    cohort.join(_member("r1", 0, 1, steps=2))
    cohort.join(_member("r2", 0, 1, steps=2))
    reports = _run(cohort, b)
    failed = dict(f for rep in reports for f in rep.failed)
    assert failed == {"r2": "node 'a' returned no output 'y', which node 'b' reads"}
    assert set(_ended(reports)) == {"r1"}


def test_a_failing_stop_rule_fails_that_member_with_its_message():
    cohort, _, b = _cohort()
    cohort.join(_member("ok", 0, 1, steps=3))
    cohort.join(_member("bad", 0, 1, steps=3, bad_rule=1))
    reports = _run(cohort, b)
    failed = dict(f for rep in reports for f in rep.failed)
    assert failed == {"bad": "stop rule of loop 'L' failed: RuntimeError: rule broke"}
    assert [p for p, _ in _client(reports)["bad"]] == [(0,)]  # iteration 0 counted before the rule broke
    assert set(_ended(reports)) == {"ok"}


def test_a_group_call_that_raises_fails_the_members_in_it():
    cohort, _, b = _cohort(AddBias(raise_on_call=2))
    cohort.join(_member("r1", 0, 1, steps=3))
    cohort.join(_member("r2", 0, 1, steps=3))
    reports = _run(cohort, b)
    failed = dict(f for rep in reports for f in rep.failed)
    assert set(failed) == {"r1", "r2"} and "device lost" in failed["r1"]
    # a member that joins afterwards runs normally
    cohort.join(_member("r3", 0, 1, steps=1))
    assert set(_ended(_run(cohort, b))) == {"r3"}


def test_an_engine_that_fails_a_step_fails_the_members_waiting_on_it():
    cohort, _, _ = _cohort()
    cohort.join(_member("r1", 0, 1, steps=3))
    assert cohort.advance() is None
    cohort.engine_failed("b", "engine 'b' failed: boom")
    report = cohort.advance()
    assert report.failed == [("r1", "engine 'b' failed: boom")] and not report.ended


def test_a_member_waits_for_futures_it_reads_and_fails_with_a_failed_one():
    cohort, _, b = _cohort()
    pending, broken = Future(), Future()
    m1 = _member("waits", 0, 1, steps=1)
    m1.entry[("a", "bias")] = pending
    m2 = _member("broken", 0, 1, steps=1)
    m2.entry[("a", "x")] = broken
    broken.state = FAILED
    cohort.join(m1)
    cohort.join(m2)
    report = cohort.advance()
    assert report.failed == [("broken", "an input of this loop failed")]
    assert cohort.joining == [m1]
    pending.value, pending.state = 7, READY
    reports = _run(cohort, b)
    assert _client(reports)["waits"] == [((0,), 7)]


def test_the_compute_thread_runs_cohorts_and_routes_their_firings():
    a, b = AddBias(), Copy()
    compute = ComputeThread({"a": a, "b": b})
    compute.start()
    try:
        plan = _plan()
        for i in range(4):
            compute.join(plan, _member(f"r{i}", i, 1, steps=3 + i))
        reports, deadline = [], time.monotonic() + 5
        while len(_ended(reports)) < 4 and time.monotonic() < deadline:
            reports += [r for _, r in compute.collect()]
            time.sleep(0.002)
    finally:
        compute.stop()
    client = _client(reports)
    for i in range(4):
        assert [v for _, v in client[f"r{i}"]] == [i + k + 1 for k in range(3 + i)]
    assert compute._cohort_firings == {}


class SlowAddBias(AddBias):
    def run_group(self, group: Group) -> list:
        time.sleep(0.002)
        return super().run_group(group)


def test_a_cohorts_group_runs_count_as_its_engines_busy_time():
    """The stats' busy seconds per component include the groups a cohort runs, not only the compute thread's steps."""
    a, b = SlowAddBias(), Copy()
    compute = ComputeThread({"a": a, "b": b})
    compute.start()
    try:
        plan = _plan()
        for i in range(3):
            compute.join(plan, _member(f"r{i}", i, 1, steps=4))
        reports, deadline = [], time.monotonic() + 5
        while len(_ended(reports)) < 3 and time.monotonic() < deadline:
            reports += [r for _, r in compute.collect()]
            time.sleep(0.002)
    finally:
        compute.stop()
    assert len(_ended(reports)) == 3
    assert compute.steps["a"] == len(a.calls) == 4  # one group call per step, all three members in each
    assert compute.items["a"] == sum(len(c) for c in a.calls) == 12
    assert compute.busy_s["a"] >= 0.002 * len(a.calls)
    assert compute.items["b"] == b.firings == 12  # b's firings are stepped as usual


def test_each_node_gets_its_own_sampling_when_the_request_names_it():
    """Per-node sampling: node a samples with its own params, node b with the request's."""
    seen: dict[str, list] = {"a": [], "b": []}

    class RecordA(AddBias):
        def run_group(self, group: Group) -> list:
            seen["a"] += group.sampling
            return super().run_group(group)

    class RecordB(Copy):
        def submit(self, firing: Firing) -> None:
            seen["b"].append(firing.sampling)
            super().submit(firing)

    cohort, _, b = _cohort(RecordA(), RecordB())
    member = _member("r", 1, 2, 2)
    member.sampling, member.node_sampling = "request's", {"a": "a's own"}
    cohort.join(member)
    _run(cohort, b)
    assert seen == {"a": ["a's own", "a's own"], "b": ["request's", "request's"]}


class Passes(GroupOnlyEngine):
    """Two guidance-like passes ``p1``/``p2`` of one component: records how the cohort called it."""

    component = "p"

    def __init__(self):
        self.calls: list[list[tuple[str, list[str]]]] = []  # per engine call: (node, members) per group

    def run_group(self, group: Group) -> list:
        return self.run_groups([group])[0]

    def run_groups(self, groups: list[Group]) -> list:
        self.calls.append([(g.node, list(g.request_ids)) for g in groups])
        scale = {"p1": 1, "p2": 10}
        return [[{"v": inp["x"] * scale[g.node]} for inp in g.inputs] for g in groups]


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
    plan = index_of(graph.plans["w"]).cohorts["L"]
    assert plan.stages == (("p1", "p2"), ("c",))

    class Combine(Copy):
        def step(self) -> list[FiringResult]:
            out = [FiringResult(f, outputs={"x": f.inputs["a"] + f.inputs["b"]}) for f in self.queue]
            self.queue = []
            return out

    passes, combine = Passes(), Combine()
    ids = itertools.count(-1, -1)
    cohort = Cohort(plan, {"p": passes, "c": combine}, lambda c: next(ids))
    for rid, x in (("r1", 1), ("r2", 2)):
        cohort.join(Member(rid, (), 3, {"steps": 3}, None, {("p1", "x"): x, ("p2", "x"): x}))
    ended = _ended(_run(cohort, combine))
    assert passes.calls == [[("p1", ["r1", "r2"]), ("p2", ["r1", "r2"])]] * 3
    assert {rid: e[4][0][1] for rid, e in ended.items()} == {"r1": [1331], "r2": [2662]}
