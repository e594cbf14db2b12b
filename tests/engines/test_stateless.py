"""The stateless engine hands its component one typed Batch per call (engines.spec)."""

from __future__ import annotations

from walkserve.core.params import Params
from walkserve.core.sampling import SamplingParams
from walkserve.engines.base import Firing, Group
from walkserve.engines.spec import Batch, Item
from walkserve.engines.stateless import StatelessEngine
from walkserve.streaming.policy import Span


class Flags(Params, frozen=True, tag="test.stateless"):
    fail: bool = False


class Recorder:
    """Doubles ``x``; remembers every batch; raises for a request whose params say ``fail``."""

    def __init__(self):
        self.batches: list[Batch] = []

    def forward_batch(self, batch: Batch) -> list[dict]:
        self.batches.append(batch)
        if any(item.params.fail for item in batch):
            raise RuntimeError("bad item")
        return [{"y": item.inputs["x"] * 2} for item in batch]


def _firing(i: int, node: str = "n", op: str = "forward", fail: bool = False) -> Firing:
    span = Span(index=i, start=0, end=1, n_context=0)
    return Firing(i, f"r{i}", "w", node, "c", op, (0, i), {"x": i}, ("y",), params=Flags(fail=fail),
                  sampling=SamplingParams(seed=i), node_params={"k": 1}, spans={"x": span})


def _group(firings: list[Firing]) -> Group:
    """Firings of one node and op as the group a cohort's step hands the engine."""
    f = firings[0]
    return Group(f.walk, f.node, f.component, f.op, f.outputs, f.node_params, [x.request_id for x in firings],
                 [x.path for x in firings], [x.inputs for x in firings], [x.params for x in firings],
                 [x.sampling for x in firings], spans=[x.spans for x in firings])


def test_a_batch_carries_each_firings_fields_and_the_shared_node_and_op():
    comp = Recorder()
    engine = StatelessEngine("c", comp)
    results, other = engine.run_groups([_group([_firing(i) for i in range(3)]), _group([_firing(3, op="other")])])
    assert results == [{"y": 0}, {"y": 2}, {"y": 4}]
    batch = comp.batches[0]
    assert (batch.node, batch.op, len(batch)) == ("n", "forward", 3)
    second = batch.items[1]
    assert isinstance(second, Item)
    assert (second.request_id, second.walk, second.path, second.iteration, second.outputs) == ("r1", "w", (0, 1), 1, ("y",))
    assert second.params == Flags() and second.sampling.seed == 1 and second.node_params == {"k": 1} and second.spans["x"].index == 1
    assert other == [{"y": 6}] and len(comp.batches) == 2 and comp.batches[-1].op == "other"


def test_a_failing_batch_is_retried_item_by_item():
    comp = Recorder()
    engine = StatelessEngine("c", comp)
    [results] = engine.run_groups([_group([_firing(0), _firing(1, fail=True)])])
    assert results[0] == {"y": 0} and "RuntimeError: bad item" in results[1]
    assert [len(b) for b in comp.batches] == [2, 1, 1]


def test_batch_of_bare_inputs():
    batch = Batch.of([{"x": 1}, {"x": 2}], node="enc")
    assert (batch.node, batch.op) == ("enc", "forward")
    assert [item.inputs["x"] for item in batch] == [1, 2]
    assert all(item.outputs == () and item.iteration == 0 and item.sampling is None for item in batch)


def test_a_step_takes_at_most_max_batch_members():
    comp = Recorder()
    engine = StatelessEngine("c", comp, max_batch=2)
    assert engine.step_capacity() == 2  # what the deadline scheduler offers one step at most
    [results] = engine.run_groups([_group([_firing(i) for i in range(3)])])  # more: still answered, in two batches
    assert results == [{"y": 0}, {"y": 2}, {"y": 4}] and [len(b) for b in comp.batches] == [2, 1]
