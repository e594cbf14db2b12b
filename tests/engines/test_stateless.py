"""The stateless engine hands its component one typed Batch per call (engines.spec)."""

from __future__ import annotations

from walkserve.core.sampling import SamplingParams
from walkserve.engines.base import Firing
from walkserve.engines.spec import Batch, Item
from walkserve.engines.stateless import StatelessEngine
from walkserve.streaming.policy import Span


class Recorder:
    """Doubles ``x``; remembers every batch; raises for a request whose params say ``fail``."""

    def __init__(self):
        self.batches: list[Batch] = []

    def forward_batch(self, batch: Batch) -> list[dict]:
        self.batches.append(batch)
        if any(item.params.get("fail") for item in batch):
            raise RuntimeError("bad item")
        return [{"y": item.inputs["x"] * 2} for item in batch]


def _firing(i: int, node: str = "n", op: str = "forward", **params) -> Firing:
    span = Span(index=i, start=0, end=1, n_context=0)
    return Firing(i, f"r{i}", "w", node, "c", op, (0, i), {"x": i}, ("y",), params=params,
                  sampling=SamplingParams(seed=i), node_params={"k": 1}, spans={"x": span})


def test_a_batch_carries_each_firings_fields_and_the_shared_node_and_op():
    comp = Recorder()
    engine = StatelessEngine("c", comp)
    for i in range(3):
        engine.submit(_firing(i))
    engine.submit(_firing(3, op="other"))
    results = engine.step()
    assert [r.outputs for r in results] == [{"y": 0}, {"y": 2}, {"y": 4}]
    [batch] = comp.batches
    assert (batch.node, batch.op, len(batch)) == ("n", "forward", 3)
    second = batch.items[1]
    assert isinstance(second, Item)
    assert (second.request_id, second.walk, second.path, second.iteration, second.outputs) == ("r1", "w", (0, 1), 1, ("y",))
    assert second.sampling.seed == 1 and second.node_params == {"k": 1} and second.spans["x"].index == 1
    assert [r.outputs for r in engine.step()] == [{"y": 6}] and comp.batches[-1].op == "other"


def test_a_failing_batch_is_retried_item_by_item():
    comp = Recorder()
    engine = StatelessEngine("c", comp)
    engine.submit(_firing(0))
    engine.submit(_firing(1, fail=True))
    results = engine.step()
    assert results[0].outputs == {"y": 0} and "RuntimeError: bad item" in results[1].error
    assert [len(b) for b in comp.batches] == [2, 1, 1]


def test_batch_of_bare_inputs():
    batch = Batch.of([{"x": 1}, {"x": 2}], node="enc")
    assert (batch.node, batch.op) == ("enc", "forward")
    assert [item.inputs["x"] for item in batch] == [1, 2]
    assert all(item.outputs == () and item.iteration == 0 and item.sampling is None for item in batch)
