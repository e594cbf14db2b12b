"""A request as the simulator sees it: profiled units, how many items each makes, and what each item waits for.

A unit is what the profile measured (``costs.CostTable.nodes``): a stateless
node, or a KV component with all its nodes. A request makes ``n_U`` items of
each unit U (those a request of the workload made when the profile ran it
alone; ``Unit.items`` is the mix's mean), one after another within the unit (a
decode loop, a codec's windows), and an item of one unit waits for items of
the units that feed it:

    forward edge P -> U (an edge, or a stream without a policy):
        U's item k needs P's item ceil(k * n_P / n_U)       (progress in proportion)
    setup edge P -> U (P outside any loop of its walk: a prefill, an encoder, a loop's initial value):
        U's item k needs P's first item
    stream P -> U with a chunk policy (first chunk at F items, then every S):
        U's item k needs P's item min(n_P, F + (k - 1) * S)
    carry P -> U (a loop's back edge: iteration k + 1 needs iteration k):
        U's item k needs P's item floor((k - 1) * n_P / n_U)

So a streamed codec starts after its first window, a nested loop's outer step
waits for the inner loop of the previous one, and a unit fed by nothing starts
when the request does. The counts of one request must agree around a loop: a
mean of 157.5 code-predictor steps over 10.5 frames, rounded to 157 over 10,
makes the first frame wait for step 16, which waits for the second frame's
input, which waits for the first frame (the simulation then releases items one
at a time, ``Simulation.forced``, and requests stop batching), hence whole
requests' counts. Where the profile measured the frontend's CPU per
request, one more unit, ``FRONTEND``, stands for the conductor and the client:
one item per item of the busiest client unit, each waiting (forward) for the
client units' outputs it carries, ``frontend_s / n`` seconds each; a
request is done when its last output has passed the frontend. Walk boundaries are not edges (a walk's outputs reach
the next walk through the conductor): units of a later walk that no edge ties
to an earlier one may start early, so latency is under-estimated there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from walkserve.engines.spec import ComponentSpec
from walkserve.graph.routes import ToCarry, ToClient, ToNode, ToStream
from walkserve.graph.walk import WalkGraph
from walkserve.planner.costs import CostTable

FRONTEND = "(frontend)"  # the conductor's and the client's CPU: a unit of no rank (simulate.py runs it on the host)
RANK = {"carry": 0, "setup": 1, "stream": 2, "forward": 3}  # which edge stands when two walks tie the same units
DEFAULT_BATCH = 64  # a stateless engine's max_batch and a KV engine's max_running, unless the component says


@dataclass(frozen=True)
class Edge:
    src: int  # unit index
    kind: str  # "forward" | "setup" | "stream" | "carry"
    first: int = 1  # stream: items before the first chunk
    step: int = 1  # stream: items per later chunk
    walks: bool = False  # carry: closes a cycle of walks through the conductor (not a loop's back edge)

    def needs(self, k: int, n_src: int, n_dst: int) -> int:
        """Items of the source that item ``k`` (1-based) of the destination waits for."""
        if self.kind == "carry":
            return min(n_src, math.floor((k - 1) * n_src / n_dst + 1e-9))
        if self.kind == "stream":
            return min(n_src, self.first + (k - 1) * self.step)
        if self.kind == "setup":
            return min(n_src, 1)
        return min(n_src, math.ceil(k * n_src / n_dst - 1e-9))


@dataclass
class Unit:
    name: str
    items: float  # per request, the profile's mean
    cap: int  # the most items one step takes
    client: bool  # its items reach the client (the first one is the request's TTFA)
    nodes: tuple[str, ...]  # graph nodes it stands for
    inputs: list[Edge] = field(default_factory=list)


@dataclass
class Flow:
    units: list[Unit]
    index: dict[str, int]
    heads: dict[int, tuple[int, int]] = field(default_factory=dict)  # loop head -> (tail unit, carry input index)

    def unit_of(self, node: str, component: str) -> int | None:
        found = self.index.get(node)
        return found if found is not None else self.index.get(component)


def build_flow(table: CostTable, graph: WalkGraph, components: dict[str, ComponentSpec]) -> Flow:
    """The units ``table`` profiled that make items, and the edges between them in every walk of ``graph``."""
    units: list[Unit] = []
    index: dict[str, int] = {}
    for name in table.nodes:
        items = table.items_per_request.get(name, 0.0)
        if items <= 0:
            continue
        nodes = tuple(n for p in graph.plans.values() for n, node in p.nodes.items()
                      if n == name or (node.component == name and name not in p.nodes))
        if not nodes:
            continue
        spec = components.get(name) or components.get(_component(graph, nodes[0]))
        cap = int((spec.options.get("max_batch") or spec.options.get("max_running") or DEFAULT_BATCH) if spec else DEFAULT_BATCH)
        index[name] = len(units)
        units.append(Unit(name, items, max(1, cap), False, tuple(dict.fromkeys(nodes))))
    flow = Flow(units, index)
    _add_edges(flow, graph)
    _add_frontend(flow, table.frontend_s)
    return flow


def _add_frontend(flow: Flow, seconds: float) -> None:
    clients = [i for i, u in enumerate(flow.units) if u.client]
    if seconds <= 0 or not clients:
        return
    items = max(flow.units[i].items for i in clients)
    flow.index[FRONTEND] = len(flow.units)
    flow.units.append(Unit(FRONTEND, items, DEFAULT_BATCH, False, (), [Edge(i, "forward") for i in clients]))


def _component(graph: WalkGraph, node: str) -> str:
    return next(p.nodes[node].component for p in graph.plans.values() if node in p.nodes)


def _add_edges(flow: Flow, graph: WalkGraph) -> None:
    seen: dict[tuple[int, int], Edge] = {}
    for plan in graph.plans.values():
        for (src, _), routes in plan.routes.items():
            if src not in plan.nodes:
                continue
            a = flow.unit_of(src, plan.nodes[src].component)
            if a is None:
                continue
            for route in routes:
                if isinstance(route, ToClient):
                    flow.units[a].client = True
                    continue
                edge, dst = _edge(plan, route, a)
                if edge is None or dst not in plan.nodes:
                    continue
                b = flow.unit_of(dst, plan.nodes[dst].component)
                if b is None or b == a:
                    continue
                if edge.kind == "forward" and not plan.chains.get(src):
                    edge = Edge(a, "setup")
                old = seen.get((a, b))
                if old is None or RANK[edge.kind] > RANK[old.kind]:  # a forward edge outranks a setup, a carry
                    seen[(a, b)] = edge
    for (a, b) in _closing_cycles(seen, len(flow.units)):
        seen[(a, b)] = Edge(a, "carry", walks=True)
    for (_, b), edge in seen.items():
        flow.units[b].inputs.append(edge)
    _find_heads(flow)


def _find_heads(flow: Flow) -> None:
    """The units that start an iteration of a loop of several units: fed only by carries (and setup edges), one
    of them a loop's back edge from another unit (the loop's tail). Qwen3-Omni's ``predictor_in``: the talker's
    code 0 and hidden state of the last frame; a one-unit loop (a decode loop) has none."""
    for b, unit in enumerate(flow.units):
        carries = [i for i, e in enumerate(unit.inputs) if e.kind == "carry" and not e.walks]
        if carries and all(e.kind in ("carry", "setup") for e in unit.inputs):
            flow.heads[b] = (unit.inputs[carries[0]].src, carries[0])


def _closing_cycles(edges: dict[tuple[int, int], Edge], n: int) -> list[tuple[int, int]]:
    """Forward edges that close a cycle of forward edges (walks chain through the conductor, so two walks may
    feed each other: BAGEL's LLM and its latents): each is read as a carry, an earlier item's output."""
    succ: dict[int, list[int]] = {}
    for (a, b), e in edges.items():
        if e.kind != "carry":
            succ.setdefault(a, []).append(b)
    state, back = [0] * n, []  # 0 unseen, 1 on the path, 2 done

    def visit(u: int) -> None:
        state[u] = 1
        for v in succ.get(u, []):
            if state[v] == 1:
                back.append((u, v))
            elif state[v] == 0:
                visit(v)
        state[u] = 2

    for u in range(n):
        if state[u] == 0:
            visit(u)
    return back


def _edge(plan, route, src: int) -> tuple[Edge | None, str]:
    if isinstance(route, ToNode):
        return Edge(src, "forward"), route.node
    if isinstance(route, ToCarry):
        return Edge(src, "carry"), route.node
    if isinstance(route, ToStream):
        info = plan.streams[route.stream]
        policy = info.policy
        first = getattr(policy, "window", None) or getattr(policy, "size", None)
        step = getattr(policy, "stride", None) or getattr(policy, "size", None)
        if first and step:
            return Edge(src, "stream", int(first), int(step)), info.consumer
        return Edge(src, "forward"), info.consumer
    return None, ""
