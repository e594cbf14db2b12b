"""StatelessEngine: batches the members of a component's groups that keep no per-request state (encoders, codecs, VAEs)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from walkserve.engines.base import Engine, Firing, Group, Result
from walkserve.engines.spec import Batch, Item


class StatelessEngine(Engine):
    """Runs ``component.forward_batch(batch)`` (``engines.spec.Batch``) on up to ``max_batch`` members of one
    node and op.

    It gathers (``Engine.gathers``): the worker hands it every cohort's groups of
    one pass in one call, so members of different cohorts share a batch. Members
    are batched by (node, op) so one batch calls the component one way; the
    component stacks or pads compatible inputs itself. If a batch raises, each
    member is retried alone so one bad request fails alone.
    """

    gathers = True

    def __init__(self, component: str, module: Any, max_batch: int = 64):
        self.component = component
        self.module = module
        self.max_batch = max_batch
        self._node_stats: dict[str, dict[str, float]] = defaultdict(lambda: {"batches": 0, "items": 0, "busy_s": 0.0})

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list[list[Result]]:
        by_key: dict[tuple[str, str], list[tuple[int, int, Firing]]] = {}  # (node, op) -> (group, member, firing)
        for g, group in enumerate(groups):
            for i, firing in enumerate(_firings(group)):
                by_key.setdefault((group.node, group.op), []).append((g, i, firing))
        results: list[list[Result]] = [[""] * len(group.request_ids) for group in groups]
        for (node, _), members in by_key.items():
            for lo in range(0, len(members), self.max_batch):
                batch = members[lo : lo + self.max_batch]
                t0 = time.perf_counter()
                answers = self._run([f for _, _, f in batch])
                stats = self._node_stats[node]
                stats["batches"] += 1
                stats["items"] += len(batch)
                stats["busy_s"] += time.perf_counter() - t0
                for (g, i, _), answer in zip(batch, answers, strict=True):
                    results[g][i] = answer
        return results

    def _run(self, batch: list[Firing]) -> list[Result]:
        try:
            outputs = self.module.forward_batch(component_batch(batch))
            return [self._check(f, o) for f, o in zip(batch, outputs, strict=True)]
        except Exception as e:
            if len(batch) == 1:
                return [_message(batch[0], e)]
        return [r for f in batch for r in self._run([f])]

    @staticmethod
    def _check(firing: Firing, outputs: dict) -> Result:
        if set(outputs) != set(firing.outputs):
            got, want = sorted(outputs), list(firing.outputs)
            return f"node {firing.node!r} returned outputs {got}, expected {want}"
        return outputs

    def step_capacity(self) -> int | None:
        return self.max_batch

    def release(self, request_id: str) -> None:
        """Nothing to free: it keeps no per-request state and answers every call before it returns."""

    def node_stats(self) -> dict[str, dict[str, float]]:
        return self._node_stats


def _firings(group: Group) -> list[Firing]:
    """The group's members as the component's ``forward_batch`` takes them."""
    spans = group.spans or [{}] * len(group.request_ids)
    return [
        Firing(i, rid, group.walk, group.node, group.component, group.op, path, inputs, group.outputs, params,
               sampling, group.node_params, span)
        for i, (rid, path, inputs, params, sampling, span) in enumerate(
            zip(group.request_ids, group.paths, group.inputs, group.params, group.sampling, spans, strict=True))
    ]


def component_batch(firings: list[Firing]) -> Batch:
    """The component's view of firings of one node and op."""
    items = tuple(Item(f.inputs, f.request_id, f.walk, f.path, f.outputs, f.params, f.sampling, f.node_params, f.spans)
                  for f in firings)
    return Batch(firings[0].node, firings[0].op, items)


def _message(firing: Firing, e: Exception) -> str:
    return f"node {firing.node!r} failed: {type(e).__name__}: {e}"
