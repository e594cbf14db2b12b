"""The compute thread: firings that read Futures run only after those resolve, in dependency order."""

from __future__ import annotations

import threading
import time

from walkserve.engines.base import Engine, Firing, FiringResult
from walkserve.worker.compute import ComputeThread, Future


class AddOne(Engine):
    """Outputs y = x + 1 for each firing, one firing per step; fails a firing whose x is negative."""

    def __init__(self) -> None:
        self.component = "add"
        self.queue: list[Firing] = []
        self.seen: list[tuple[str, object]] = []  # (firing node, the x it was given)
        self.released: list[str] = []

    def submit(self, firing: Firing) -> None:
        self.seen.append((firing.node, firing.inputs["x"]))
        self.queue.append(firing)

    def has_work(self) -> bool:
        return bool(self.queue)

    def step(self) -> list[FiringResult]:
        f = self.queue.pop(0)
        x = f.inputs["x"]
        if x < 0:
            return [FiringResult(f, error="negative")]
        return [FiringResult(f, outputs={"y": x + 1})]

    def release(self, request_id: str) -> None:
        self.released.append(request_id)
        self.queue = [f for f in self.queue if f.request_id != request_id]


def _firing(fid: int, rid: str, node: str, x) -> tuple[str, Firing, dict[str, Future]]:
    firing = Firing(fid, rid, "w", node, "add", "forward", (), {"x": x}, ("y",))
    return "add", firing, {"y": Future()}


def _collect(compute: ComputeThread, n: int, timeout: float = 5.0) -> list:
    out, deadline = [], time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += [r for _, r in compute.collect()]
        time.sleep(0.005)
    return out


def test_a_chain_handed_over_at_once_runs_in_order_with_resolved_inputs():
    engine = AddOne()
    compute = ComputeThread({"add": engine})
    first = _firing(1, "r", "n1", 1)
    second = _firing(2, "r", "n2", first[2]["y"])
    third = _firing(3, "r", "n3", second[2]["y"])
    compute.fire_many([third, second, first])  # dependents first: they wait for their inputs
    compute.start()
    try:
        results = _collect(compute, 3)
    finally:
        compute.stop()
    assert [r.firing.node for r in results] == ["n1", "n2", "n3"]
    assert [r.outputs["y"] for r in results] == [2, 3, 4]
    assert engine.seen == [("n1", 1), ("n2", 2), ("n3", 3)]  # never a Future


def test_a_failed_input_fails_its_dependents_only():
    engine = AddOne()
    compute = ComputeThread({"add": engine})
    bad = _firing(1, "r1", "bad", -1)
    after_bad = _firing(2, "r1", "after", bad[2]["y"])
    good = _firing(3, "r2", "good", 5)
    compute.fire_many([after_bad, bad, good])
    compute.start()
    try:
        results = {r.firing.node: r for r in _collect(compute, 3)}
    finally:
        compute.stop()
    assert results["bad"].error == "negative"
    assert results["after"].error == "an input of this firing failed"
    assert results["good"].outputs == {"y": 6}
    assert [node for node, _ in engine.seen] == ["bad", "good"]


def test_a_released_request_gets_no_more_results():
    """Release while a dependent firing waits on a future whose producer is running."""
    engine = AddOne()
    gate, stepping = threading.Event(), threading.Event()
    step = engine.step

    def gated_step() -> list[FiringResult]:
        if engine.queue[0].node == "head":
            stepping.set()
            assert gate.wait(5)
        return step()

    engine.step = gated_step
    compute = ComputeThread({"add": engine})
    head = _firing(1, "gone", "head", 1)
    parked = _firing(2, "gone", "parked", head[2]["y"])
    other = _firing(3, "stays", "other", 7)
    compute.start()
    try:
        compute.fire_many([head, parked, other])
        assert stepping.wait(5)
        compute.release("gone")
        gate.set()
        results = _collect(compute, 2, timeout=2.0)
        time.sleep(0.1)
        results += [r for _, r in compute.collect()]
    finally:
        compute.stop()
    assert "gone" in engine.released
    assert "parked" not in [node for node, _ in engine.seen]
    assert [r.firing.node for r in results if r.firing.request_id == "gone"] == ["head"]
    assert [r.outputs["y"] for r in results if r.firing.node == "other"] == [8]


class Closing(AddOne):
    """Counts close() calls and notes whether a step ever ran after one."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = 0
        self.used_after_close = False

    def step(self) -> list[FiringResult]:
        self.used_after_close |= self.closed > 0
        return super().step()

    def close(self) -> None:
        self.closed += 1


def test_stop_closes_every_engine_once_after_its_last_step():
    engines = {"add": Closing(), "other": Closing()}
    compute = ComputeThread(engines)
    compute.fire_many([_firing(1, "r", "n1", 1)])
    compute.start()
    assert len(_collect(compute, 1)) == 1
    compute.stop()
    compute.stop()
    assert [e.closed for e in engines.values()] == [1, 1]
    assert not any(e.used_after_close for e in engines.values())
