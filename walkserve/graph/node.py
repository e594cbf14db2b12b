"""GraphNode: one forward of one component."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from walkserve.core.errors import GraphError
from walkserve.graph.section import Section

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
RESERVED = frozenset({"input", "output", "client", "drop"})


def check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise GraphError(f"{kind} name {name!r} is not valid (letters, digits, '_' and '-', no dots)")


@dataclass(frozen=True, eq=False)
class GraphNode(Section):
    """One forward of one component, with named input slots and named outputs.

    It fires for a (request, walk, iteration) key once every input slot for
    that key is filled; its outputs carry the same key. ``component`` names
    the component (weights, engine) that runs it and defaults to ``name``;
    several nodes may share a component (the CFG branches of an image model),
    and the same node name may appear in several walks (``lm`` in prefill and
    decode), which is what placement refers to. ``op`` and ``params`` are
    handed to the component unchanged. ``speculate=False`` forbids running
    this node's next loop iteration before the loop's stop rule for the
    current one is known (walkserve's executor never does; see DynamicLoop).
    """

    name: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    component: str = ""
    op: str = "forward"
    speculate: bool = True
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("node", self.name)
        if self.name in RESERVED:
            raise GraphError(f"node name {self.name!r} is reserved ({', '.join(sorted(RESERVED))})")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        for kind, names in (("input", self.inputs), ("output", self.outputs)):
            for slot in names:
                check_name(f"{kind} of node {self.name!r}", slot)
            if len(set(names)) != len(names):
                raise GraphError(f"node {self.name!r} declares a duplicate {kind} name: {list(names)}")
        if not self.component:
            object.__setattr__(self, "component", self.name)

    def nodes(self) -> Iterator[GraphNode]:
        yield self

    def children(self) -> tuple[Section, ...]:
        return ()

    def out(self, output: str) -> str:
        """Edge endpoint of an output: ``node.out("token") == "lm.token"``."""
        if output not in self.outputs:
            raise GraphError(f"node {self.name!r} has no output {output!r} (outputs: {list(self.outputs)})")
        return f"{self.name}.{output}"

    def inp(self, slot: str) -> str:
        """Edge endpoint of an input slot."""
        if slot not in self.inputs:
            raise GraphError(f"node {self.name!r} has no input {slot!r} (inputs: {list(self.inputs)})")
        return f"{self.name}.{slot}"

    def __repr__(self) -> str:
        return f"GraphNode({self.name!r}, in={list(self.inputs)}, out={list(self.outputs)})"
