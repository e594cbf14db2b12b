"""Walks, the model state machine, and the WalkGraph that holds them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from walkserve.core.errors import GraphError
from walkserve.core.request import RequestSpec, Value
from walkserve.graph.edge import GraphEdge
from walkserve.graph.node import GraphNode, check_name
from walkserve.graph.playback import Playback
from walkserve.graph.section import Section

if TYPE_CHECKING:
    from walkserve.graph.plan import WalkPlan


class Walk:
    """A named section of the graph for one phase of a request (prefill, decode, image_gen ...).

    ``inputs`` are filled when the walk starts (from the request or an
    earlier walk, as the state machine decides) and read by edges from
    ``"input.<name>"``. ``outputs`` are filled by edges to
    ``"output.<name>"`` and handed to the state machine when the walk ends.
    ``playback`` maps the nodes on a streamed audio path, in path order, to
    what their firings add to the client's playback (``graph.playback``); the
    runtime schedules such a walk's requests by their playback deadlines.
    """

    def __init__(
        self,
        name: str,
        body: Section,
        edges: Sequence[GraphEdge],
        inputs: Sequence[str] = (),
        outputs: Sequence[str] = (),
        playback: Mapping[str, Playback] | None = None,
    ):
        check_name("walk", name)
        self.name = name
        self.body = body
        self.edges = tuple(edges)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        for e in self.edges:
            if not isinstance(e, GraphEdge):
                raise GraphError(f"walk {name!r}: {e!r} is not a GraphEdge")
        self.playback = dict(playback or {})
        unknown = set(self.playback) - {n.name for n in self.nodes()}
        if unknown:
            raise GraphError(f"walk {name!r}: playback names unknown nodes {sorted(unknown)}")

    def nodes(self) -> list[GraphNode]:
        return list(self.body.nodes())

    def __repr__(self) -> str:
        return f"Walk({self.name!r})"


@dataclass(frozen=True)
class WalkStart:
    """Which walk a request runs next, with the values of that walk's inputs."""

    walk: str
    inputs: Mapping[str, Value] = field(default_factory=dict)


class StateMachine(ABC):
    """Chooses a request's walks.

    ``first`` is called once at admission; ``next`` after each walk ends, with
    that walk's outputs, and returns the next walk or None when the request
    is done. Both run in the conductor: keep them cheap and torch-free.
    """

    @abstractmethod
    def first(self, request: RequestSpec) -> WalkStart: ...

    @abstractmethod
    def next(self, request: RequestSpec, finished: str, outputs: Mapping[str, Value]) -> WalkStart | None: ...


class FunctionStateMachine(StateMachine):
    """A state machine from two plain functions."""

    def __init__(
        self,
        first: Callable[[RequestSpec], WalkStart],
        next: Callable[[RequestSpec, str, Mapping[str, Value]], WalkStart | None] | None = None,
    ):
        self._first = first
        self._next = next

    def first(self, request: RequestSpec) -> WalkStart:
        return self._first(request)

    def next(self, request: RequestSpec, finished: str, outputs: Mapping[str, Value]) -> WalkStart | None:
        return self._next(request, finished, outputs) if self._next else None


class WalkGraph:
    """A model's walks and state machine, validated at construction.

    Each walk is compiled into a :class:`WalkPlan` (scopes, routes, slot
    sources); any malformation raises GraphError naming what is wrong.
    """

    def __init__(self, name: str, walks: Sequence[Walk], state_machine: StateMachine):
        from walkserve.graph.plan import compile_walk

        self.name = name
        self.walks: dict[str, Walk] = {}
        for w in walks:
            if w.name in self.walks:
                raise GraphError(f"model {name!r}: duplicate walk name {w.name!r}")
            self.walks[w.name] = w
        if not self.walks:
            raise GraphError(f"model {name!r} has no walks")
        if not isinstance(state_machine, StateMachine):
            raise GraphError(f"model {name!r}: state_machine must be a StateMachine")
        self.state_machine = state_machine
        self.plans: dict[str, WalkPlan] = {w.name: compile_walk(w) for w in self.walks.values()}
        self._check_nodes_across_walks()

    def _check_nodes_across_walks(self) -> None:
        component_of: dict[str, tuple[str, str]] = {}
        for w in self.walks.values():
            for node in w.nodes():
                seen = component_of.setdefault(node.name, (node.component, w.name))
                if seen[0] != node.component:
                    raise GraphError(
                        f"node {node.name!r} runs component {seen[0]!r} in walk {seen[1]!r} "
                        f"but {node.component!r} in walk {w.name!r}; a node name means one component"
                    )

    def node_names(self) -> list[str]:
        """Every node name of every walk, in first-seen order."""
        seen: dict[str, None] = {}
        for w in self.walks.values():
            for node in w.nodes():
                seen.setdefault(node.name, None)
        return list(seen)

    def components(self) -> dict[str, list[str]]:
        """component name -> the node names that run it."""
        out: dict[str, list[str]] = {}
        for w in self.walks.values():
            for node in w.nodes():
                names = out.setdefault(node.component, [])
                if node.name not in names:
                    names.append(node.name)
        return out

    def walk(self, name: str) -> Walk:
        try:
            return self.walks[name]
        except KeyError:
            raise GraphError(f"model {self.name!r} has no walk {name!r} (walks: {list(self.walks)})") from None

    def check_start(self, start: WalkStart) -> None:
        """Raise GraphError if a state machine's choice names an unknown walk or wrong inputs."""
        walk = self.walk(start.walk)
        missing = set(walk.inputs) - set(start.inputs)
        extra = set(start.inputs) - set(walk.inputs)
        if missing or extra:
            raise GraphError(
                f"walk {walk.name!r} takes inputs {list(walk.inputs)}; the state machine gave "
                f"{sorted(start.inputs)} (missing {sorted(missing)}, unknown {sorted(extra)})"
            )
