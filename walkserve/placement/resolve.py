"""Check a placement against a model: coverage, stateful components kept together, memory."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from walkserve.core.errors import PlacementError
from walkserve.graph.walk import WalkGraph
from walkserve.placement.plan import Placement


def walk_nodes(graph: WalkGraph) -> dict[str, list[str]]:
    return {w: [n.name for n in walk.nodes()] for w, walk in graph.walks.items()}


def check_placement(
    placement: Placement,
    graph: WalkGraph,
    stateful: set[str],
    weight_bytes: Mapping[str, int],
    state_bytes: Mapping[str, int],
) -> None:
    """Raise PlacementError if the placement cannot serve this model."""
    walks = walk_nodes(graph)
    placement.check_covers(walks)
    for comp, nodes in graph.components().items():
        if comp not in stateful:
            continue
        seen: dict[tuple[int, ...], str] = {}
        for w, names in walks.items():
            for n in names:
                if n in nodes:
                    seen.setdefault(placement.ranks_for(w, n), f"node {n!r} in walk {w!r}")
        if len(seen) > 1:
            where = "; ".join(f"{what} on ranks {list(r)}" for r, what in seen.items())
            raise PlacementError(
                f"{placement.source}: component {comp!r} keeps per-request state, so every node that runs it "
                f"must be placed on the same ranks ({where}); moving that state between ranks is not supported yet"
            )
    demands: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for rank in placement.ranks:
        hosted = {graph.plans[w].nodes[n].component for w, n in placement.nodes_on(rank, walks)}
        for comp in sorted(hosted):
            if weight_bytes.get(comp):
                demands[rank].append((f"weights of {comp}", weight_bytes[comp]))
            if state_bytes.get(comp):
                demands[rank].append((f"state of {comp}", state_bytes[comp]))
    placement.check_memory(demands)
