"""Render a WalkGraph as Mermaid or Graphviz DOT text, one cluster per walk and per loop."""

from __future__ import annotations

from walkserve.graph.compose import DynamicLoop
from walkserve.graph.plan import (
    INPUT,
    ToCarry,
    ToClient,
    ToDrop,
    ToNode,
    ToOutput,
    ToStream,
    WalkPlan,
)
from walkserve.graph.walk import WalkGraph


def _id(*parts: str) -> str:
    return "_".join(p.replace("-", "_").replace(":", "_").replace(".", "_") for p in parts)


def _loop_label(plan: WalkPlan, scope_id: str) -> str:
    scope = plan.scopes[scope_id]
    if scope.kind == "stream":
        return f"per chunk of {plan.streams[scope.stream].policy.describe()}"
    loop = scope.loop
    if isinstance(loop, DynamicLoop):
        return f"DynamicLoop {loop.name}: {loop.stop.describe()}, at most {loop.iterations}"
    return f"Loop {loop.name}: {loop.iterations} iterations"


def _edges(plan: WalkPlan):
    """(src id, dst id, label, kind) for every route of a walk; kind: data|carry|stream|client."""
    w = plan.name
    for (src, out), routes in plan.routes.items():
        sid = _id(w, "in", out) if src == INPUT else _id(w, src)
        label = out
        for r in routes:
            if isinstance(r, ToNode):
                exits = "".join(f" ({plan.loop(s).outputs[f'{src}.{out}']})" for s in r.exits)
                yield sid, _id(w, r.node), f"{label}→{r.slot}{exits}", "data"
            elif isinstance(r, ToCarry):
                yield sid, _id(w, r.node), f"{label}→{r.slot} carry", "carry"
            elif isinstance(r, ToStream):
                info = plan.streams[r.stream]
                yield sid, _id(w, info.consumer), f"{label}→{info.slot} {info.policy.describe()}", "stream"
            elif isinstance(r, ToClient):
                yield sid, _id(w, "client", r.modality), label, "client"
            elif isinstance(r, ToOutput):
                yield sid, _id(w, "out", r.name), label, "data"
            elif isinstance(r, ToDrop):
                yield sid, _id(w, "drop"), label, "data"


def _terminals(plan: WalkPlan) -> dict[str, str]:
    w, out = plan.name, {}
    for name in plan.walk.inputs:
        out[_id(w, "in", name)] = f"input.{name}"
    for name in plan.walk.outputs:
        out[_id(w, "out", name)] = f"output.{name}"
    for routes in plan.routes.values():
        for r in routes:
            if isinstance(r, ToClient):
                out[_id(w, "client", r.modality)] = f"client: {r.modality}"
            elif isinstance(r, ToDrop):
                out[_id(w, "drop")] = "drop"
    return out


def _node_label(plan: WalkPlan, name: str) -> str:
    node = plan.nodes[name]
    comp = f" [{node.component}]" if node.component != name else ""
    return f"{name}{comp}"


def to_mermaid(graph: WalkGraph, walks: list[str] | None = None) -> str:
    lines = ["flowchart TD"]
    for plan in (graph.plans[w] for w in (walks or graph.plans)):
        w = plan.name
        lines.append(f'  subgraph {_id("walk", w)}["walk {w}"]')
        for tid, label in _terminals(plan).items():
            lines.append(f'    {tid}(["{label}"])')
        _mermaid_level(plan, (), lines, "    ")
        lines.append("  end")
        arrows = {"data": "-->", "carry": "==>", "stream": "-.->", "client": "-->"}
        for s, d, label, kind in _edges(plan):
            lines.append(f'  {s} {arrows[kind]}|"{label}"| {d}')
    return "\n".join(lines) + "\n"


def _mermaid_level(plan: WalkPlan, level: tuple[str, ...], lines: list[str], indent: str) -> None:
    for name, chain in plan.chains.items():
        if chain == level:
            lines.append(f'{indent}{_id(plan.name, name)}["{_node_label(plan, name)}"]')
    for scope_id, scope in plan.scopes.items():
        if scope.chain[:-1] == level:
            lines.append(f'{indent}subgraph {_id(plan.name, "scope", scope_id)}["{_loop_label(plan, scope_id)}"]')
            _mermaid_level(plan, scope.chain, lines, indent + "  ")
            lines.append(f"{indent}end")


def to_dot(graph: WalkGraph, walks: list[str] | None = None) -> str:
    lines = [f'digraph "{graph.name}" {{', "  rankdir=TB;", "  node [shape=box, fontname=Helvetica];"]
    for plan in (graph.plans[w] for w in (walks or graph.plans)):
        lines.append(f'  subgraph "cluster_{_id("walk", plan.name)}" {{')
        lines.append(f'    label="walk {plan.name}";')
        for tid, label in _terminals(plan).items():
            lines.append(f'    {tid} [label="{label}", shape=ellipse];')
        _dot_level(plan, (), lines, "    ")
        lines.append("  }")
        styles = {"data": "", "carry": ", style=bold", "stream": ", style=dashed", "client": ""}
        for s, d, label, kind in _edges(plan):
            lines.append(f'  {s} -> {d} [label="{label}"{styles[kind]}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_level(plan: WalkPlan, level: tuple[str, ...], lines: list[str], indent: str) -> None:
    for name, chain in plan.chains.items():
        if chain == level:
            lines.append(f'{indent}{_id(plan.name, name)} [label="{_node_label(plan, name)}"];')
    for scope_id, scope in plan.scopes.items():
        if scope.chain[:-1] == level:
            lines.append(f'{indent}subgraph "cluster_{_id(plan.name, "scope", scope_id)}" {{')
            lines.append(f'{indent}  label="{_loop_label(plan, scope_id)}"; style=rounded;')
            _dot_level(plan, scope.chain, lines, indent + "  ")
            lines.append(f"{indent}}}")
