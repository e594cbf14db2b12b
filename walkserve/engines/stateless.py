"""StatelessEngine: batches firings of a component that keeps no per-request state (encoders, codecs, VAEs)."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from typing import Any

from walkserve.engines.base import Engine, Firing, FiringResult
from walkserve.engines.spec import Batch, Item


class StatelessEngine(Engine):
    """Runs ``component.forward_batch(batch)`` (``engines.spec.Batch``) on up to ``max_batch`` queued firings
    of one node and op.

    Firings are grouped by (node, op) so one batch calls the component one way;
    the component stacks or pads compatible inputs itself. If a batch raises,
    each firing is retried alone so one bad request fails alone.
    """

    def __init__(self, component: str, module: Any, max_batch: int = 64):
        self.component = component
        self.module = module
        self.max_batch = max_batch
        self.queue: deque[Firing] = deque()
        self.node_stats: dict[str, dict[str, float]] = defaultdict(lambda: {"batches": 0, "items": 0, "busy_s": 0.0})

    def submit(self, firing: Firing) -> None:
        self.queue.append(firing)

    def has_work(self) -> bool:
        return bool(self.queue)

    def step(self) -> list[FiringResult]:
        if not self.queue:
            return []
        head = self.queue[0]
        key = (head.node, head.op)
        batch, rest = [], deque()
        while self.queue and len(batch) < self.max_batch:
            f = self.queue.popleft()
            (batch if (f.node, f.op) == key else rest).append(f)
        self.queue.extendleft(reversed(rest))
        t0 = time.perf_counter()
        results = self._run(batch)
        stats = self.node_stats[head.node]
        stats["batches"] += 1
        stats["items"] += len(batch)
        stats["busy_s"] += time.perf_counter() - t0
        return results

    def _run(self, batch: list[Firing]) -> list[FiringResult]:
        try:
            outputs = self.module.forward_batch(component_batch(batch))
            return [self._check(f, o) for f, o in zip(batch, outputs, strict=True)]
        except Exception as e:
            if len(batch) == 1:
                return [FiringResult(batch[0], error=_message(batch[0], e))]
        return [r for f in batch for r in self._run([f])]

    @staticmethod
    def _check(firing: Firing, outputs: dict) -> FiringResult:
        if set(outputs) != set(firing.outputs):
            got, want = sorted(outputs), list(firing.outputs)
            return FiringResult(firing, error=f"node {firing.node!r} returned outputs {got}, expected {want}")
        return FiringResult(firing, outputs=outputs)

    def release(self, request_id: str) -> None:
        self.queue = deque(f for f in self.queue if f.request_id != request_id)

    def stats(self) -> dict[str, float]:
        return {"queued": float(len(self.queue))}


def component_batch(firings: list[Firing]) -> Batch:
    """The component's view of firings of one node and op."""
    items = tuple(Item(f.inputs, f.request_id, f.walk, f.path, f.outputs, f.params, f.sampling, f.node_params, f.spans)
                  for f in firings)
    return Batch(firings[0].node, firings[0].op, items)


def _message(firing: Firing, e: Exception) -> str:
    return f"node {firing.node!r} failed: {type(e).__name__}: {e}"
