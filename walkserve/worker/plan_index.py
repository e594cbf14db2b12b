"""Per-plan facts the worker dataflow looks up on every event, computed once per plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from walkserve.graph.compose import DynamicLoop
from walkserve.graph.plan import (
    INPUT,
    FromCarry,
    FromStream,
    StreamInfo,
    ToCarry,
    ToClient,
    ToNode,
    ToOutput,
    ToStream,
    WalkPlan,
)

Path = tuple[int, ...]


class DataflowError(Exception):
    """The request cannot go on (bad iteration count, stream overflow, a loop with no last value)."""


@dataclass
class PlanIndex:
    """Per-plan facts the dataflow looks up on every event, computed once."""

    depth: dict[str, int] = field(default_factory=dict)  # scope -> number of enclosing scopes
    bound_spec: dict[str, Any] = field(default_factory=dict)  # scope -> Count
    stop_of: dict[str, tuple[str, str, Any]] = field(
        default_factory=dict
    )  # stop node -> (scope, output, rule)
    speculate: dict[str, bool] = field(
        default_factory=dict
    )  # node -> may run ahead of the stop rule
    scope_nodes: dict[str, list[str]] = field(default_factory=dict)
    consumers: dict[str, set[str]] = field(
        default_factory=dict
    )  # node/input -> nodes it feeds directly
    produces: dict[str, list[StreamInfo]] = field(
        default_factory=dict
    )  # node -> streams it produces
    exit_routes: dict[tuple[str, str], list] = field(default_factory=dict)
    route_src: dict[Any, tuple[str, str]] = field(
        default_factory=dict
    )  # exit route -> (node, output)
    held_routes: dict[tuple[str, str], list] = field(default_factory=dict)
    slots: dict[str, list] = field(default_factory=dict)  # node -> [(slot, source)]
    stream_slots: dict[str, list] = field(default_factory=dict)  # node -> [(slot, FromStream)]
    forward: dict[tuple[str, str], list[str]] = field(
        default_factory=dict
    )  # (node, out) -> consumers, no exits
    recipes: dict[str, list] = field(default_factory=dict)  # node -> [(slot, recipe)] (see _recipe)
    dynamic_levels: dict[str, list[tuple[int, str]]] = field(
        default_factory=dict
    )  # node -> [(depth, scope)]
    # (node, output) -> the consumers that read each of its per-iteration values exactly once
    # (one entry per reading slot); outputs some consumer reads at many paths are absent
    once_readers: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    chain_len: dict[str, int] = field(default_factory=dict)  # node -> number of enclosing scopes
    # node -> [(depth, scope, is stream scope)] of the scopes that decide whether an iteration is real
    exposure: dict[str, list[tuple[int, str, bool]]] = field(default_factory=dict)
    stream_scope: dict[str, bool] = field(default_factory=dict)  # scope -> iterates over stream chunks
    cohorts: dict[str, Any] = field(default_factory=dict)  # scope -> CohortPlan of the loops a cohort may run


INPUT_KEY, EDGE, CARRY, STREAM = 0, 1, 2, 3


def recipe(plan: WalkPlan, idx: PlanIndex, source: Any) -> tuple:
    """How to find a slot's value key from a firing path, decided once per plan."""
    if isinstance(source, FromStream):
        return (STREAM, source)
    if isinstance(source, FromCarry):
        d = len(plan.scopes[source.scope].chain) - 1
        return (CARRY, d, source.node, source.output, recipe(plan, idx, source.initial))
    if source.node == INPUT:
        return (INPUT_KEY, (INPUT, source.output, ()))
    if source.exits:
        depth = len(plan.scopes[source.exits[-1]].chain) - 1
        return (EDGE, source.node, source.output, depth)
    return (EDGE, source.node, source.output, len(plan.chains[source.node]))


def value_key(recipe: tuple, path: Path) -> tuple:
    tag = recipe[0]
    if tag == EDGE:
        return (recipe[1], recipe[2], path[: recipe[3]])
    if tag == INPUT_KEY:
        return recipe[1]
    d = recipe[1]
    if path[d] == 0:
        return value_key(recipe[4], path)
    return (recipe[2], recipe[3], (*path[:d], path[d] - 1))


def index_of(plan: WalkPlan) -> PlanIndex:
    idx = getattr(plan, "_dataflow_index", None)
    if idx is not None:
        return idx
    idx = PlanIndex()
    for sid, scope in plan.scopes.items():
        idx.depth[sid] = len(scope.chain) - 1
        idx.scope_nodes[sid] = plan.scope_nodes(sid)
        if scope.loop is not None:
            idx.bound_spec[sid] = scope.loop.iterations
            if isinstance(scope.loop, DynamicLoop):
                node, out = scope.loop.stop.output.split(".")
                idx.stop_of[node] = (sid, out, scope.loop.stop)
    for name, node in plan.nodes.items():
        ok = node.speculate
        for sid in plan.chains[name]:
            loop = plan.scopes[sid].loop
            if isinstance(loop, DynamicLoop) and not loop.speculate:
                ok = False
        idx.speculate[name] = ok
    for sid, scope in plan.scopes.items():
        idx.stream_scope[sid] = scope.kind == "stream"
    for name, node in plan.nodes.items():
        idx.chain_len[name] = len(plan.chains[name])
        idx.exposure[name] = [
            (d, sid, plan.scopes[sid].kind == "stream")
            for d, sid in enumerate(plan.chains[name])
            if plan.scopes[sid].kind != "loop"
        ]
        idx.slots[name] = [(slot, plan.sources[(name, slot)]) for slot in node.inputs]
        idx.recipes[name] = [(slot, recipe(plan, idx, src)) for slot, src in idx.slots[name]]
        idx.dynamic_levels[name] = [
            (d, sid)
            for d, sid in enumerate(plan.chains[name])
            if plan.scopes[sid].kind == "dynamic"
        ]
        idx.stream_slots[name] = [
            (s, src) for s, src in idx.slots[name] if isinstance(src, FromStream)
        ]
    for (src, out), routes in plan.routes.items():
        for r in routes:
            if isinstance(r, (ToNode, ToCarry)) and not getattr(r, "exits", ()):
                idx.forward.setdefault((src, out), []).append(r.node)
            if isinstance(r, (ToNode, ToCarry)):
                idx.consumers.setdefault(src, set()).add(r.node)
                if isinstance(r, ToNode) and r.exits:
                    idx.exit_routes.setdefault((src, out), []).append(r)
                    idx.route_src[r] = (src, out)
            elif isinstance(r, ToOutput) and r.exits:
                idx.exit_routes.setdefault((src, out), []).append(r)
                idx.route_src[r] = (src, out)
            elif isinstance(r, (ToClient, ToStream, ToOutput)):
                idx.held_routes.setdefault((src, out), []).append(r)
            if isinstance(r, ToStream):
                idx.produces.setdefault(src, []).append(plan.streams[r.stream])
    idx.once_readers = _once_readers(plan, idx)
    idx.cohorts = _cohort_plans(plan, idx)
    plan._dataflow_index = idx
    return idx


def _cohort_plans(plan: WalkPlan, idx: PlanIndex) -> dict[str, Any]:
    from walkserve.worker.cohort_plan import cohort_plans  # it reads this module's recipes

    return cohort_plans(plan, idx)


def _once_readers(plan: WalkPlan, idx: PlanIndex) -> dict[tuple[str, str], list[str]]:
    """Outputs whose values at the producer's own path each have a known number of reads.

    A consumer reads such a value once when it sits in exactly the producer's
    scopes (it fires once per path, at the producer's path) or reads it as a
    loop carry from the same loop (at the next iteration). A consumer nested
    deeper reads one value at every inner iteration, so that output is left
    out: its values stay until the walk ends. Exit values (a loop's last or
    accumulated output, keyed at an outer path) are not counted here.
    """
    readers: dict[tuple[str, str], list[str]] = {
        (n, out): [] for n, node in plan.nodes.items() for out in node.outputs
    }
    many: set[tuple[str, str]] = set()

    def visit(consumer: str, r: tuple) -> None:
        if r[0] == EDGE:
            src, depth = (r[1], r[2]), r[3]
            if src in readers and depth == len(plan.chains[src[0]]):
                exact = plan.chains[consumer] == plan.chains[src[0]]
                (readers[src].append(consumer) if exact else many.add(src))
        elif r[0] == CARRY:
            d, src = r[1], (r[2], r[3])
            if src in readers and len(plan.chains[src[0]]) == d + 1:
                exact = len(plan.chains[consumer]) == d + 1
                (readers[src].append(consumer) if exact else many.add(src))
            visit(consumer, r[4])

    for consumer, recipes in idx.recipes.items():
        for _, r in recipes:
            visit(consumer, r)
    return {src: names for src, names in readers.items() if src not in many}
