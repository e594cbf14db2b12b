"""Compile a Walk into a WalkPlan: scopes, routes and slot sources, validated.

The plan is what executors read. Every node gets a *chain*: the scopes that
enclose it, outermost first. A scope is a Loop, a DynamicLoop, or the
implicit per-chunk scope of a node that consumes a stream outside any loop
of its own ("stream:<node>"). A firing's key is (request, walk, node, path)
where path holds one iteration index per scope of the node's chain.

    route of a regular edge src -> dst, with C the common prefix of their chains:
      src chain  = C + exits      the value leaves these loops (each declares last/accumulate)
      dst chain  = C + enters     the value is invariant for every iteration of these
    carry (loop L):   src at path p+(k,)  fills dst at p+(k+1,)
    stream:           one item per iteration of the producer's innermost loop;
                      chunk i fills iteration i of the consumer's scope
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from walkserve.core.errors import GraphError
from walkserve.graph.compose import DynamicLoop, Loop, Parallel, Sequential
from walkserve.graph.edge import Client, Drop, GraphEdge, StreamingGraphEdge, split_endpoint
from walkserve.graph.node import GraphNode
from walkserve.graph.routes import (
    INPUT,
    OUTPUT,
    FromCarry,
    FromEdge,
    FromStream,
    Route,
    Scope,
    SlotSource,
    StreamInfo,
    ToCarry,
    ToClient,
    ToDrop,
    ToNode,
    ToOutput,
    ToStream,
)
from walkserve.graph.section import Section
from walkserve.graph.walk import Walk
from walkserve.streaming.policy import ChunkPolicy

__all__ = [
    "INPUT",
    "OUTPUT",
    "FromCarry",
    "FromEdge",
    "FromStream",
    "Route",
    "Scope",
    "SlotSource",
    "StreamInfo",
    "ToCarry",
    "ToClient",
    "ToDrop",
    "ToNode",
    "ToOutput",
    "ToStream",
    "WalkPlan",
    "compile_walk",
    "iter_units",
]

@dataclass
class WalkPlan:
    walk: Walk
    nodes: dict[str, GraphNode]
    chains: dict[str, tuple[str, ...]]
    scopes: dict[str, Scope]
    routes: dict[tuple[str, str], list[Route]]
    sources: dict[tuple[str, str], SlotSource]
    streams: list[StreamInfo]
    # dependency graph between the units (nodes or child scopes) of each scope level
    unit_deps: dict[tuple[str, ...], dict[str, set[str]]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.walk.name

    def loop(self, scope: str) -> Loop:
        s = self.scopes[scope]
        assert s.loop is not None, scope
        return s.loop

    def stop_node(self, scope: str) -> str | None:
        loop = self.scopes[scope].loop
        if isinstance(loop, DynamicLoop):
            return loop.stop.output.split(".")[0]
        return None


def _err(walk: Walk, msg: str) -> GraphError:
    return GraphError(f"walk {walk.name!r}: {msg}")


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


class _Compiler:
    def __init__(self, walk: Walk):
        self.walk = walk
        self.nodes: dict[str, GraphNode] = {}
        self.loop_chain: dict[str, tuple[str, ...]] = {}
        self.scopes: dict[str, Scope] = {}
        self.ancestry: dict[str, list[tuple[int, int]]] = {}  # node -> [(id(Sequential), index)]
        self.routes: dict[tuple[str, str], list[Route]] = defaultdict(list)
        self.sources: dict[tuple[str, str], SlotSource] = {}
        self.streams: list[StreamInfo] = []

    # -- structure ---------------------------------------------------------------------------
    def collect(self, section: Section, chain: tuple[str, ...], seq: list[tuple[int, int]]) -> None:
        if isinstance(section, GraphNode):
            if section.name in self.nodes:
                raise _err(self.walk, f"node {section.name!r} appears twice")
            self.nodes[section.name] = section
            self.loop_chain[section.name] = chain
            self.ancestry[section.name] = list(seq)
            return
        if isinstance(section, Loop):
            if section.name in self.scopes:
                raise _err(self.walk, f"duplicate loop name {section.name!r}")
            inner = (*chain, section.name)
            self.scopes[section.name] = Scope(section.name, section.kind, inner, section)
            self.collect(section.body, inner, seq)
            return
        if isinstance(section, Sequential):
            for i, child in enumerate(section.sections):
                self.collect(child, chain, [*seq, (id(section), i)])
            return
        if isinstance(section, Parallel):
            for child in section.branches:
                self.collect(child, chain, seq)
            return
        raise _err(self.walk, f"unknown section {section!r}")

    # -- endpoints ---------------------------------------------------------------------------
    def src_of(self, edge: GraphEdge) -> tuple[str, str]:
        node, out = split_endpoint(edge.src, edge, self.walk.name)
        if node == INPUT:
            if out not in self.walk.inputs:
                raise _err(self.walk, f"edge {edge}: unknown walk input {out!r} (inputs: {list(self.walk.inputs)})")
            return node, out
        if node not in self.nodes:
            raise _err(self.walk, f"edge {edge}: unknown node {node!r}")
        if out not in self.nodes[node].outputs:
            raise _err(
                self.walk, f"edge {edge}: node {node!r} has no output {out!r} (outputs: {list(self.nodes[node].outputs)})"
            )
        return node, out

    def dst_node_slot(self, endpoint: str, what: str) -> tuple[str, str]:
        node, slot = split_endpoint(endpoint, GraphEdge("?", endpoint), self.walk.name)
        if node not in self.nodes:
            raise _err(self.walk, f"{what}: unknown node {node!r}")
        if slot not in self.nodes[node].inputs:
            raise _err(
                self.walk, f"{what}: node {node!r} has no input {slot!r} (inputs: {list(self.nodes[node].inputs)})"
            )
        return node, slot

    def chain(self, node: str) -> tuple[str, ...]:
        return () if node == INPUT else self.loop_chain[node]

    # -- streams -----------------------------------------------------------------------------
    def plan_streams(self) -> None:
        for edge in self.walk.edges:
            if not isinstance(edge, StreamingGraphEdge):
                continue
            if edge.policy is None or not isinstance(edge.policy, ChunkPolicy):
                raise _err(self.walk, f"streaming edge {edge} has no chunk policy")
            src, out = self.src_of(edge)
            if not isinstance(edge.dst, str):
                raise _err(self.walk, f"streaming edge {edge} must end at a node input")
            dst, slot = self.dst_node_slot(edge.dst, f"streaming edge {edge}")
            if edge.capacity < edge.policy.min_capacity():
                raise _err(
                    self.walk,
                    f"streaming edge {edge}: capacity {edge.capacity} is below the {edge.policy.min_capacity()} "
                    "items its policy needs",
                )
            pchain = self.chain(src)
            if not pchain:
                raise _err(self.walk, f"streaming edge {edge}: producer {src!r} is not inside a loop")
            qchain = self.loop_chain[dst]
            if pchain[-1] in qchain:
                raise _err(
                    self.walk,
                    f"streaming edge {edge}: consumer {dst!r} is inside the producer's loop {pchain[-1]!r}",
                )
            index = len(self.streams)
            if qchain and qchain[-1] not in pchain:
                mode, cscope = "loop", qchain[-1]
                loop = self.scopes[cscope].loop
                if not isinstance(loop, DynamicLoop) or loop.stop.output.split(".")[0] != dst:
                    raise _err(
                        self.walk,
                        f"streaming edge {edge}: consumer {dst!r} sits in loop {cscope!r}, so it must be that "
                        "DynamicLoop's stop node (the loop ends when the stream is exhausted)",
                    )
            else:
                mode, cscope = "chunk", f"stream:{dst}"
                if cscope in self.scopes:
                    raise _err(self.walk, f"node {dst!r} consumes two streams outside a loop of its own")
                self.scopes[cscope] = Scope(cscope, "stream", (*qchain, cscope), stream=index)
            self.streams.append(
                StreamInfo(index, edge, src, out, dst, slot, edge.policy, edge.capacity, pchain[-1], cscope, mode)
            )

    def spread_stream_scopes(self) -> None:
        """Put each chunk consumer, and every node fed by its per-chunk outputs, in its stream scope."""
        for info in self.streams:
            if info.mode == "chunk":
                self.loop_chain[info.consumer] = self.scopes[info.consumer_scope].chain
        changed = True
        while changed:
            changed = False
            for edge in self.walk.edges:
                if isinstance(edge, StreamingGraphEdge) or not isinstance(edge.dst, str):
                    continue
                src, _ = self.src_of(edge)
                if src == INPUT or not self.chain(src) or self.scopes[self.chain(src)[-1]].kind != "stream":
                    continue
                if edge.dst.split(".")[0] == OUTPUT:
                    continue
                dst, _ = self.dst_node_slot(edge.dst, f"edge {edge}")
                schain, dchain = self.chain(src), self.loop_chain[dst]
                if dchain == schain:
                    continue
                if dchain == schain[:-1]:
                    self.loop_chain[dst] = schain
                    changed = True
                    continue
                if any(self.scopes[s].kind == "stream" for s in dchain):
                    raise _err(self.walk, f"edge {edge}: node {dst!r} takes per-chunk outputs of two streams")
                raise _err(
                    self.walk,
                    f"edge {edge}: node {dst!r} takes per-chunk output of stream consumer {src!r} but is not at "
                    "its level; per-chunk outputs go to nodes beside it, the client, a streaming edge or DROP",
                )

    # -- routes and sources ------------------------------------------------------------------
    def exits_for(self, edge: GraphEdge, src: str, out: str, dchain: tuple[str, ...]) -> tuple[str, ...]:
        schain = self.chain(src)
        common = _common(schain, dchain)
        exits = tuple(reversed(schain[len(common) :]))
        for scope_id in exits:
            scope = self.scopes[scope_id]
            if scope.kind == "stream":
                raise _err(
                    self.walk,
                    f"edge {edge}: per-chunk output {src}.{out} cannot leave stream scope of {scope_id[7:]!r}; "
                    "send it to the client, a streaming edge, a node beside it or DROP",
                )
            if f"{src}.{out}" not in scope.loop.outputs:
                raise _err(
                    self.walk,
                    f"edge {edge}: output {src}.{out} leaves loop {scope_id!r}, which does not declare it; "
                    f"add outputs={{'{src}.{out}': 'last' or 'accumulate'}} to the loop",
                )
        return exits

    def add_source(self, node: str, slot: str, source: SlotSource, edge: object) -> None:
        if (node, slot) in self.sources:
            raise _err(self.walk, f"input {node}.{slot} is filled twice (again by {edge})")
        self.sources[(node, slot)] = source

    def plan_edges(self) -> dict[str, int]:
        outputs_filled: dict[str, int] = defaultdict(int)
        for edge in self.walk.edges:
            src, out = self.src_of(edge)
            if isinstance(edge, StreamingGraphEdge):
                info = next(s for s in self.streams if s.edge is edge)
                self.routes[(src, out)].append(ToStream(info.index))
                self.add_source(info.consumer, info.slot, FromStream(info.index), edge)
                continue
            dst = edge.dst
            if isinstance(dst, Client):
                self.routes[(src, out)].append(ToClient(dst.modality))
            elif isinstance(dst, Drop):
                self.routes[(src, out)].append(ToDrop())
            elif isinstance(dst, str) and dst.split(".")[0] == OUTPUT:
                name = split_endpoint(dst, edge, self.walk.name)[1]
                if name not in self.walk.outputs:
                    raise _err(self.walk, f"edge {edge}: unknown walk output {name!r} (outputs: {list(self.walk.outputs)})")
                self.routes[(src, out)].append(ToOutput(name, self.exits_for(edge, src, out, ())))
                outputs_filled[name] += 1
            elif isinstance(dst, str):
                node, slot = self.dst_node_slot(dst, f"edge {edge}")
                exits = self.exits_for(edge, src, out, self.loop_chain[node])
                self.routes[(src, out)].append(ToNode(node, slot, exits))
                self.add_source(node, slot, FromEdge(src, out, exits), edge)
            else:
                raise _err(self.walk, f"edge {edge}: destination must be 'node.input', 'output.name', Client or DROP")
        return outputs_filled

    def plan_carries(self) -> None:
        for scope in list(self.scopes.values()):
            loop = scope.loop
            if loop is None:
                continue
            for src_ep, dsts in loop.carry.items():
                what = f"carry {src_ep} -> {list(dsts)} of loop {loop.name!r}"
                src, out = split_endpoint(src_ep, GraphEdge(src_ep, "?"), self.walk.name)
                if src not in self.nodes or out not in self.nodes[src].outputs:
                    raise _err(self.walk, f"{what}: {src_ep!r} is not an output of a node in the walk")
                if self.loop_chain[src] != scope.chain:
                    raise _err(self.walk, f"{what}: {src!r} is not directly in the loop's body")
                for dst_ep in dsts:
                    node, slot = self.dst_node_slot(dst_ep, what)
                    if self.loop_chain[node] != scope.chain:
                        raise _err(self.walk, f"{what}: {node!r} is not directly in the loop's body")
                    initial = self.sources.pop((node, slot), None)
                    if not isinstance(initial, FromEdge):
                        raise _err(
                            self.walk,
                            f"{what}: {dst_ep} has no initial value; add an edge from outside the loop to it",
                        )
                    if loop.name in self.chain(initial.node):
                        raise _err(self.walk, f"{what}: the initial value of {dst_ep} comes from inside the loop")
                    self.routes[(src, out)].append(ToCarry(node, slot, loop.name))
                    self.add_source(node, slot, FromCarry(loop.name, src, out, initial), what)

    # -- checks ------------------------------------------------------------------------------
    def check_complete(self, outputs_filled: dict[str, int]) -> None:
        for name, node in self.nodes.items():
            for slot in node.inputs:
                if (name, slot) not in self.sources:
                    raise _err(self.walk, f"input {name}.{slot} is filled by nothing")
        stop_reads = {
            s.loop.stop.output for s in self.scopes.values() if isinstance(s.loop, DynamicLoop)
        }
        for name, node in self.nodes.items():
            for out in node.outputs:
                if not self.routes.get((name, out)) and f"{name}.{out}" not in stop_reads:
                    raise _err(
                        self.walk, f"output {name}.{out} goes nowhere; route it to a node, the client, a walk output or DROP"
                    )
        for inp in self.walk.inputs:
            if not self.routes.get((INPUT, inp)):
                raise _err(self.walk, f"walk input {inp!r} is never used")
        for name in self.walk.outputs:
            if outputs_filled.get(name, 0) != 1:
                raise _err(self.walk, f"walk output {name!r} is filled {outputs_filled.get(name, 0)} times (must be 1)")

    def check_loops(self) -> None:
        for scope in self.scopes.values():
            loop = scope.loop
            if loop is None:
                continue
            body = {n for n, c in self.loop_chain.items() if loop.name in c}
            if not body:
                raise _err(self.walk, f"loop {loop.name!r} has no nodes")
            for ep in loop.outputs:
                node, out = split_endpoint(ep, GraphEdge(ep, "?"), self.walk.name)
                if node not in body or out not in self.nodes[node].outputs:
                    raise _err(self.walk, f"loop {loop.name!r} declares output {ep!r}, which is not a body output")
            if isinstance(loop, DynamicLoop):
                node, out = split_endpoint(loop.stop.output, GraphEdge(loop.stop.output, "?"), self.walk.name)
                if node not in self.nodes or out not in self.nodes[node].outputs:
                    raise _err(self.walk, f"stop rule of loop {loop.name!r} reads {loop.stop.output!r}, no such output")
                if self.loop_chain[node] != scope.chain:
                    raise _err(self.walk, f"stop rule of loop {loop.name!r} reads {node!r}, not directly in its body")

    def dependency_levels(self) -> dict[tuple[str, ...], dict[str, set[str]]]:
        """Per scope level, unit -> units it depends on; raise on a cycle or a backwards Sequential edge."""
        levels: dict[tuple[str, ...], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for node, chain in self.loop_chain.items():
            for depth in range(len(chain) + 1):
                level = chain[:depth]
                levels[level].setdefault(chain[depth] if depth < len(chain) else node, set())
        for (src, out), routes in self.routes.items():
            if src == INPUT:
                continue
            for r in routes:
                if isinstance(r, (ToNode, ToStream)):
                    dst = r.node if isinstance(r, ToNode) else self.streams[r.stream].consumer
                    sc, dc = self.chain(src), self.chain(dst)
                    level = _common(sc, dc)
                    us = sc[len(level)] if len(sc) > len(level) else src
                    ud = dc[len(level)] if len(dc) > len(level) else dst
                    if us != ud:
                        levels[level][ud].add(us)
                    self.check_order(src, dst, f"{src}.{out}")
        for level, deps in levels.items():
            cycle = _find_cycle(deps)
            if cycle:
                where = f"loop {level[-1]!r}" if level else "the walk's top level"
                raise _err(self.walk, f"cycle outside a loop in {where}: {' -> '.join(cycle)}")
        return {k: dict(v) for k, v in levels.items()}

    def check_order(self, src: str, dst: str, what: str) -> None:
        sa, da = self.ancestry[src], self.ancestry[dst]
        for (s_id, s_i), (d_id, d_i) in zip(sa, da):
            if s_id != d_id:
                return
            if s_i != d_i:
                if s_i > d_i:
                    raise _err(
                        self.walk, f"{what} -> {dst!r} goes backwards in a Sequential (cycle outside a loop)"
                    )
                return


def _find_cycle(deps: dict[str, set[str]]) -> list[str] | None:
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        color[u] = 1
        stack.append(u)
        for v in sorted(deps.get(u, ())):
            if color.get(v) == 1:
                return [*stack[stack.index(v) :], v]
            if color.get(v) is None:
                found = visit(v)
                if found:
                    return found
        stack.pop()
        color[u] = 2
        return None

    for u in sorted(deps):
        if color.get(u) is None:
            found = visit(u)
            if found:
                return list(reversed(found))
    return None


def compile_walk(walk: Walk) -> WalkPlan:
    """Validate ``walk`` and derive its plan; raise GraphError naming the offending piece."""
    c = _Compiler(walk)
    c.collect(walk.body, (), [])
    if not c.nodes:
        raise _err(walk, "has no nodes")
    if len(set(walk.inputs)) != len(walk.inputs) or len(set(walk.outputs)) != len(walk.outputs):
        raise _err(walk, "declares a duplicate walk input or output name")
    for name in c.scopes:
        if name in c.nodes:
            raise _err(walk, f"loop name {name!r} is also a node name")
    c.plan_streams()
    c.spread_stream_scopes()
    outputs_filled = c.plan_edges()
    c.plan_carries()
    c.check_loops()
    c.check_complete(outputs_filled)
    levels = c.dependency_levels()
    return WalkPlan(
        walk=walk,
        nodes=c.nodes,
        chains=dict(c.loop_chain),
        scopes=c.scopes,
        routes=dict(c.routes),
        sources=c.sources,
        streams=c.streams,
        unit_deps=levels,
    )


def iter_units(plan: WalkPlan, level: tuple[str, ...]) -> Iterator[str]:
    """Units (nodes or child scope ids) of one scope level in a dependency order."""
    deps = plan.unit_deps.get(level, {})
    done: set[str] = set()
    order = list(deps)

    def visit(u: str) -> Iterator[str]:
        if u in done:
            return
        done.add(u)
        for v in sorted(deps.get(u, ())):
            yield from visit(v)
        yield u

    for u in order:
        yield from visit(u)
