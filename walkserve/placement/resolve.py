"""Check a placement against a model: coverage, stateful components kept together, memory."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from walkserve.core.errors import PlacementError
from walkserve.graph.kv import declared_ops
from walkserve.graph.walk import WalkGraph
from walkserve.placement.plan import Placement

StateSize = Callable[[str, int | None], int]  # (device, bytes free there once weights are loaded) -> bytes


def walk_nodes(graph: WalkGraph) -> dict[str, list[str]]:
    return {w: [n.name for n in walk.nodes()] for w, walk in graph.walks.items()}


def check_placement(
    placement: Placement,
    graph: WalkGraph,
    stateful: set[str],
    weight_bytes: Mapping[str, int],
    state_bytes: Mapping[str, int | StateSize],
    device_free: Callable[[str], int | None] | None = None,
    kv_shares: Mapping[str, str] | None = None,
    movable: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Raise PlacementError if the placement cannot serve this model.

    ``state_bytes``: per component a size, or a function of (device, bytes free
    there once the rank's weights are loaded) for state the engine sizes from
    the device (a KV pool). ``device_free(device)`` reads a GPU's free memory;
    it is asked only for GPU ranks with a memory budget, and never under Ray,
    where the rank's budget stands for the memory of the GPU Ray will pick. ``kv_shares`` maps
    components to their KV share group (components that read each other's KV
    contexts): every node of a group must run on the same ranks. A stateful
    component keeps each KV context on one set of ranks within a walk;
    ``movable`` ones (their engine moves a request's contexts) may use a
    context on other ranks in another walk (prefill on one rank, decode on
    another).
    """
    walks = walk_nodes(graph)
    placement.check_covers(walks)
    check_kv_shares(placement, graph, walks, kv_shares or {})
    check_state_kept_together(placement, graph, walks, stateful, movable)
    demands = {rank: rank_demands(placement, rank, graph, walks, weight_bytes, state_bytes, device_free)
               for rank in placement.ranks}
    placement.check_memory(demands)
    check_host_memory(placement, demands, available_host_bytes())


def rank_demands(
    placement: Placement,
    rank: int,
    graph: WalkGraph,
    walks: dict[str, list[str]],
    weight_bytes: Mapping[str, int],
    state_bytes: Mapping[str, int | StateSize],
    device_free: Callable[[str], int | None] | None,
) -> list[tuple[str, int]]:
    """[(what, bytes)] the components hosted on ``rank`` will take there."""
    spec = placement.ranks[rank]
    hosted = sorted({graph.plans[w].nodes[n].component for w, n in placement.nodes_on(rank, walks)})
    weights = sum(weight_bytes.get(c, 0) for c in hosted)
    free = None
    if spec.device != "cpu" and spec.memory is not None and any(callable(state_bytes.get(c)) for c in hosted):
        if placement.launcher == "ray":  # Ray picks the GPU, maybe on another node: the budget stands for its memory
            free = spec.memory
        else:
            free = device_free(spec.device) if device_free is not None else None
        if free is None:
            raise PlacementError(f"{placement.source}: rank {rank} ({spec.device}): its free memory cannot be read "
                                 f"here, so the memory budget cannot be checked")
        free = max(0, free - weights)
    out = []
    for comp in hosted:
        if weight_bytes.get(comp):
            out.append((f"weights of {comp}", weight_bytes[comp]))
        size = state_bytes.get(comp) or 0
        if callable(size):
            if spec.device != "cpu" and free is None:
                continue  # a GPU rank without a budget: there is nothing to check its state against
            size = size(spec.device, free)
        if size:
            out.append((f"state of {comp}", size))
    return out


def check_state_kept_together(placement: Placement, graph: WalkGraph, walks: Mapping[str, list[str]],
                              stateful: set[str], movable: set[str] | frozenset[str] = frozenset()) -> None:
    """A stateful component's per-request state stays where it is used: within a walk, every node touching one
    of its KV contexts (writing, reading, forking from or into it; a node without declared operations touches
    ``main``) must be placed on the same ranks; across walks too, unless the component is ``movable`` (its
    engine moves the context to the rank of the next walk). Nodes over different contexts may sit apart."""
    seen: dict[tuple[str, str], tuple[tuple[int, ...], str]] = {}  # (component, context) -> (ranks, where)
    for w, names in walks.items():
        here: dict[tuple[str, str], tuple[tuple[int, ...], str]] = {}
        for n in names:
            node = graph.plans[w].nodes[n]
            if node.component not in stateful:
                continue
            ranks, where = placement.ranks_for(w, n), f"node {n!r} in walk {w!r}"
            for context in touched_contexts(node.params):
                key = (node.component, context)
                first = here.setdefault(key, (ranks, where))
                why = "within one walk"
                if first[0] == ranks and node.component not in movable:
                    first, why = seen.setdefault(key, (ranks, where)), "and its engine cannot move that state"
                if first[0] != ranks:
                    raise PlacementError(
                        f"{placement.source}: component {node.component!r} keeps per-request state, so every node "
                        f"that touches its context {context!r} must be placed on the same ranks ({first[1]} on ranks "
                        f"{list(first[0])}; node {n!r} in walk {w!r} on ranks {list(ranks)}) {why}"
                    )


def touched_contexts(params: Mapping[str, Any]) -> set[str]:
    """The KV contexts a node's declared operations write, read or fork."""
    out: set[str] = set()
    for op in declared_ops(params):
        out.update((op.context, *op.reads, *((op.source,) if op.source else ())))
    return out


def check_kv_shares(placement: Placement, graph: WalkGraph, walks: Mapping[str, list[str]],
                    kv_shares: Mapping[str, str]) -> None:
    """Components of one KV share group read each other's contexts: refuse a placement that separates two."""
    where: dict[str, tuple[tuple[int, ...], str, str]] = {}  # group -> (ranks, component, node in walk)
    for w, names in walks.items():
        for n in names:
            comp = graph.plans[w].nodes[n].component
            group = kv_shares.get(comp)
            if not group:
                continue
            ranks = placement.ranks_for(w, n)
            seen = where.setdefault(group, (ranks, comp, f"node {n!r} in walk {w!r}"))
            if seen[0] != ranks:
                raise PlacementError(
                    f"{placement.source}: components {seen[1]!r} and {comp!r} share KV contexts (kv_share "
                    f"{group!r}), so they must be placed on the same ranks; {seen[2]} is on ranks {list(seen[0])} "
                    f"but node {n!r} in walk {w!r} is on ranks {list(ranks)}"
                )


def available_host_bytes() -> int | None:
    """MemAvailable of this host (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_host_memory(placement: Placement, demands: dict[int, list[tuple[str, int]]], available: int | None) -> None:
    """CPU ranks on this host without a budget share its RAM: their weights and state must fit in it."""
    if available is None:
        return
    local_cpu = [r for r, s in placement.ranks.items() if s.device == "cpu" and not s.remote and s.memory is None]
    total = sum(b for r in local_cpu for _, b in demands.get(r, ()))
    if total > available:
        parts = ", ".join(f"rank {r}: {sum(b for _, b in demands.get(r, ())) / 2**30:.2f} GiB" for r in local_cpu)
        raise PlacementError(
            f"{placement.source}: the CPU ranks need {total / 2**30:.2f} GiB of RAM ({parts}) but this host has "
            f"{available / 2**30:.2f} GiB available; free memory, use fewer replicas, or set a rank's memory budget"
        )
