"""Loop semantics through the reference executor: carries, invariants, last/accumulate, per-request stop, nesting."""

from __future__ import annotations

import torch

from walkserve.core.array import ArrayData
from walkserve.core.finish import FinishReason
from walkserve.core.params import Params
from walkserve.core.request import RequestSpec
from walkserve.graph import (
    ACCUMULATE,
    LAST,
    Client,
    DynamicLoop,
    FunctionStateMachine,
    GraphEdge,
    GraphNode,
    Loop,
    Sequential,
    StopOnValue,
    Walk,
    WalkGraph,
    WalkStart,
)
from walkserve.testing.fixtures.base import FunctionComponent
from walkserve.testing.reference import ReferenceExecutor


def one(v: float) -> ArrayData:
    return ArrayData.from_list([v], "float32")


class Recorder:
    def __init__(self, fn):
        self.calls = []
        self.fn = fn

    def __call__(self, f):
        self.calls.append((f.path, {k: v.clone() for k, v in f.inputs.items()}))
        return self.fn(f)


class Limit(Params, frozen=True, tag="test.limit"):
    limit: int = 1


def run(walk, components, params=None, inputs=None):
    sm = FunctionStateMachine(lambda r: WalkStart(walk.name, r.inputs))
    g = WalkGraph("t", [walk], sm)
    ex = ReferenceExecutor(g, {k: FunctionComponent(v) for k, v in components.items()})
    return ex.run(RequestSpec(inputs or {"x": one(10.0), "zero": one(0.0)}, params=params or Params()))


def test_carry_fills_the_next_iteration_and_invariants_every_iteration():
    rec = Recorder(lambda f: {"b": f.inputs["a"] + 1, "c": f.inputs["a"] * f.inputs["x"]})
    loop = Loop(
        GraphNode("n", ["a", "x"], ["b", "c"]),
        iterations=5,
        carry={"n.b": "n.a"},
        outputs={"n.b": LAST, "n.c": ACCUMULATE},
        name="L",
    )
    walk = Walk(
        "w",
        Sequential(loop, GraphNode("after", ["last", "all"], ["out"])),
        [
            GraphEdge("input.zero", "n.a"),
            GraphEdge("input.x", "n.x"),
            GraphEdge("n.b", "after.last"),
            GraphEdge("n.c", "after.all"),
            GraphEdge("after.out", Client("latent")),
        ],
        inputs=["x", "zero"],
    )
    seen = {}
    res = run(walk, {"n": rec, "after": lambda f: seen.update(f.inputs) or {"out": f.inputs["last"]}})
    assert res.error is None
    # iteration k sees the carry from k-1 (never its own output) and the same invariant x
    assert [p for p, _ in rec.calls] == [(k,) for k in range(5)]
    assert [float(i["a"]) for _, i in rec.calls] == [0, 1, 2, 3, 4]
    assert all(float(i["x"]) == 10 for _, i in rec.calls)
    assert float(seen["last"]) == 5  # last iteration's b
    assert seen["all"].tolist() == [0, 10, 20, 30, 40]  # accumulate = concatenation of every iteration


def dyn_walk(include_stopping: bool):
    loop = DynamicLoop(
        GraphNode("n", ["t"], ["t"]),
        stop=StopOnValue("n.t", values=(0,), include_stopping=include_stopping),
        max_iterations="limit",
        carry={"n.t": "n.t"},
        name="D",
    )
    return Walk("w", loop, [GraphEdge("input.x", "n.t"), GraphEdge("n.t", Client("text"))], inputs=["x"])


def countdown(f):
    return {"t": f.inputs["t"] - 1}


def test_each_request_stops_at_its_own_iteration():
    for start, limit in [(3, 10), (5, 10), (8, 4)]:
        for include in (False, True):
            res = run(dyn_walk(include), {"n": countdown}, Limit(limit=limit), {"x": ArrayData.from_list([start])})
            values = [int(v) for v in res.stream("text")]
            natural = list(range(start - 1, -1, -1))  # start-1 ... 0
            if start <= limit:
                expected = natural if include else natural[:-1]
                assert res.finish == FinishReason.STOP
            else:
                expected = natural[:limit]
                assert res.finish == FinishReason.LENGTH
            assert values == expected, (start, limit, include)
            assert [o.path for o in res.outputs] == [(k,) for k in range(len(expected))]


def test_nested_loops_exit_through_both_levels():
    from walkserve.models.base import ModelRef
    from walkserve.testing.fixtures import nested
    from walkserve.testing.fixtures.base import FixtureParams

    nested_params = FixtureParams(outer=3, inner_len=2)

    model = nested.build(ModelRef("fixture-nested"))
    ex = ReferenceExecutor.for_model(model)
    res = ex.run(RequestSpec({"x": one(1.0)}, params=nested_params))
    assert res.error is None
    # plain-Python restatement of the fixture
    acc, all_y, paths = 0.0, [], []
    for i in range(3):
        h = 1.0 + acc * 0.5 + i
        y, ys = 0.0, []
        for j in range(2):
            y = h * 0.25 + y + j
            ys.append(y)
            paths.append((i, j))
        all_y += ys
        acc = acc + sum(ys)
    out = res.walk_outputs[0]
    assert torch.allclose(torch.tensor(out["acc"].tolist()), torch.tensor([acc]))
    assert torch.allclose(torch.tensor(out["all_y"].tolist()), torch.tensor(all_y))
    assert [o.path for o in res.outputs] == paths
