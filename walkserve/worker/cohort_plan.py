"""Which loops a worker may run as a cohort, and how each body slot finds its value there.

A loop qualifies when its body is flat (no inner scope), touches no stream,
and its outputs leave only to its own nodes, to the client, or through the
loop's exits (last / accumulated value). One request's instance of such a
loop then runs inside the compute thread together with every other request's
instance of the same loop (``worker.cohort``): one engine call per body node
per step for the whole cohort, the stop rule applied between steps, and only
the exposed iterations reported. Body nodes that do not depend on each other
in one iteration form a *stage*; the nodes of one stage that share an engine
run in one call (``Engine.run_groups``): the three guidance passes of a CFG
step are one forward.

A body slot is read as (slot, how, a, b):

    (slot, CUR, node, out)      a body node's output of the same iteration
    (slot, CARRIED, key, None)  the previous iteration's output of a body node
                                (the value captured at entry for iteration 0)
    (slot, FIXED, key, None)    a value from outside the loop, captured at entry

where ``key`` = (consumer, slot) names the captured value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from walkserve.graph.compose import LAST
from walkserve.graph.plan import ToCarry, ToClient, ToDrop, ToNode, ToOutput, WalkPlan
from walkserve.worker.plan_index import CARRY, EDGE, INPUT_KEY, PlanIndex

CUR, CARRIED, FIXED = 0, 1, 2


@dataclass(frozen=True)
class NodeSpec:
    component: str
    op: str
    outputs: tuple[str, ...]
    params: Any


@dataclass(frozen=True)
class CohortPlan:
    walk: str
    scope: str
    depth: int  # the scope's position in a path
    dynamic: bool
    nodes: tuple[str, ...]  # the body, in dependency order
    stages: tuple[tuple[str, ...], ...]  # ``nodes`` cut into stages of nodes independent of each other
    specs: dict[str, NodeSpec]
    slots: dict[str, tuple[tuple[str, int, Any, Any], ...]]  # node -> ((slot, how, a, b), ...)
    entry: tuple[tuple[tuple[str, str], tuple], ...]  # ((consumer, slot), recipe) captured at entry
    carries: tuple[tuple[tuple[str, str], str, str], ...]  # ((consumer, slot), node, out)
    stop: tuple[str, str, Any] | None  # (node, output, rule) of a DynamicLoop
    client: tuple[tuple[str, str, str], ...]  # (node, out, modality) sent to the client when exposed
    exits: tuple[tuple[str, str, Any, bool], ...]  # (node, out, route, keeps only the last value)


def cohort_plans(plan: WalkPlan, idx: PlanIndex) -> dict[str, CohortPlan]:
    out = {}
    for sid, scope in plan.scopes.items():
        if scope.kind in ("loop", "dynamic"):
            cp = _cohort_plan(plan, idx, sid)
            if cp is not None:
                out[sid] = cp
    return out


def _cohort_plan(plan: WalkPlan, idx: PlanIndex, sid: str) -> CohortPlan | None:
    chain, body = plan.scopes[sid].chain, idx.scope_nodes[sid]
    if not body or any(plan.chains[n] != chain or idx.stream_slots[n] or n in idx.produces for n in body):
        return None
    reads = _reads(idx, sid, body, len(chain))
    leaves = _leaves(plan, sid, body)
    if reads is None or leaves is None:
        return None
    slots, entry, carries, deps = reads
    stages = _stages(body, deps)
    stop = None
    if plan.scopes[sid].kind == "dynamic":
        stop_node = next((n for n, (s, _, _) in idx.stop_of.items() if s == sid), None)
        if stop_node is None:
            return None
        _, out, rule = idx.stop_of[stop_node]
        stop = (stop_node, out, rule)
    if stages is None:
        return None
    nodes = plan.nodes
    specs = {n: NodeSpec(nodes[n].component, nodes[n].op, nodes[n].outputs, nodes[n].params) for n in body}
    order = tuple(n for stage in stages for n in stage)
    return CohortPlan(plan.name, sid, idx.depth[sid], stop is not None, order, stages, specs, slots, entry, carries,
                      stop, *leaves)


def _reads(idx: PlanIndex, sid: str, body: list[str], chain_len: int) -> tuple | None:
    """How each body slot finds its value (see the module doc), or None when one cannot in a cohort."""
    depth, members = idx.depth[sid], set(body)
    slots: dict[str, tuple] = {}
    entry, carries = [], []
    deps: dict[str, set[str]] = {n: set() for n in body}
    for node in body:
        node_slots = []
        for slot, r in idx.recipes[node]:
            if r[0] == EDGE and r[1] in members:
                if r[3] != chain_len:
                    return None
                node_slots.append((slot, CUR, r[1], r[2]))
                deps[node].add(r[1])
            elif r[0] == CARRY and r[1] == depth:
                if r[2] not in members:
                    return None
                key = (node, slot)
                entry.append((key, r[4]))
                carries.append((key, r[2], r[3]))
                node_slots.append((slot, CARRIED, key, None))
            elif r[0] in (EDGE, INPUT_KEY, CARRY):  # from outside the loop: the same at every iteration
                if r[0] == CARRY and r[1] > depth:
                    return None
                entry.append(((node, slot), r))
                node_slots.append((slot, FIXED, (node, slot), None))
            else:
                return None
        slots[node] = tuple(node_slots)
    return slots, tuple(entry), tuple(carries), deps


def _leaves(plan: WalkPlan, sid: str, body: list[str]) -> tuple[tuple, tuple] | None:
    """(client outputs, exits) of the body, or None when an output goes anywhere else."""
    client, exits, members, loop = [], [], set(body), plan.loop(sid)
    for node in body:
        for out in plan.nodes[node].outputs:
            for route in plan.routes.get((node, out), ()):
                if isinstance(route, (ToNode, ToCarry)) and not getattr(route, "exits", ()):
                    if route.node not in members:
                        return None
                elif isinstance(route, (ToNode, ToOutput)) and route.exits:
                    if route.exits[0] != sid:
                        return None
                    exits.append((node, out, route, loop.outputs[f"{node}.{out}"] == LAST))
                elif isinstance(route, ToClient):
                    client.append((node, out, route.modality))
                elif not isinstance(route, ToDrop):
                    return None
    return tuple(client), tuple(exits)


def _stages(body: list[str], deps: dict[str, set[str]]) -> tuple[tuple[str, ...], ...] | None:
    """The body in dependency order, as stages: each stage's nodes read only earlier stages' outputs of the
    iteration (None if the same-iteration edges had a cycle, which a plan never has)."""
    done: set[str] = set()
    stages: list[tuple[str, ...]] = []
    while len(done) < len(body):
        ready = tuple(n for n in body if n not in done and deps[n] <= done)
        if not ready:
            return None
        stages.append(ready)
        done.update(ready)
    return tuple(stages)
