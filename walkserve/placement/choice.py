"""Which rank runs each node of a request's walk: the one rule the conductor and the workers share.

A node placed on one rank runs there. Among replicas, a component keeps the
rank it was given earlier in the request (its per-request state, e.g. a KV
cache, stays put) while that rank is a candidate; otherwise it goes where the
request already runs a replicated component, if that rank is a candidate (a
request stays inside one replica of a replicated block, so its LM's tokens do
not cross to the other replica's codec), else to the least loaded candidate;
either way the choice is remembered. A worker that picks a request's next walk
itself (``walk_here``) may do so only when that rule gives its own rank for
every node without asking for the load: one candidate, or a component already
given this rank.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from walkserve.graph.plan import WalkPlan
from walkserve.placement.plan import Placement


def choose_rank(placement: Placement, plan: WalkPlan, node: str, sticky: dict[str, int], load: Callable[[int], int]) -> int:
    """The rank for ``node`` of ``plan``'s walk; ``sticky`` (component -> rank) is updated for replicas."""
    candidates = placement.ranks_for(plan.name, node)
    if len(candidates) == 1:
        return candidates[0]
    component = plan.nodes[node].component
    rank = sticky.get(component)
    if rank is None or rank not in candidates:
        held = [r for r in candidates if r in sticky.values()]  # ranks the request already runs on
        rank = sticky[component] = min(held or candidates, key=lambda r: (load(r), r))
    return rank


def walk_here(placement: Placement, plan: WalkPlan, rank: int, sticky: Mapping[str, int]) -> dict[str, int] | None:
    """Every node of the walk on ``rank`` by the rule above, or None if some node would go elsewhere."""
    ranks = {}
    for node, gnode in plan.nodes.items():
        candidates = placement.ranks_for(plan.name, node)
        if candidates != (rank,) and (rank not in candidates or sticky.get(gnode.component) != rank):
            return None
        ranks[node] = rank
    return ranks
