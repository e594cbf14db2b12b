"""Pieces of a family's ``Model.memory_report`` (torch-free): who sits on which rank, and each rank's budget.

A family's report says, per rank, what it will hold from the checkpoint's real
sizes (safetensors headers, ``common/safetensors_files.py``) and its KV pool
(``common/kv_sizing.py``), and raises PlacementError with those numbers when a
rank's budget cannot hold them.
"""

from __future__ import annotations

from collections.abc import Callable

from walkserve.graph.walk import WalkGraph
from walkserve.placement.plan import Placement, RankSpec

KIB, MIB, GIB = 2**10, 2**20, 2**30


def components_per_rank(graph: WalkGraph, placement: Placement) -> dict[int, list[str]]:
    """rank -> the components (sorted) of the nodes ``placement`` puts there, over every walk."""
    from walkserve.placement.resolve import walk_nodes

    walks = walk_nodes(graph)
    return {rank: sorted({graph.plans[w].nodes[n].component for w, n in placement.nodes_on(rank, walks)})
            for rank in placement.ranks}


def rank_budget(spec: RankSpec, device_memory: Callable[[str], int | None] | None) -> int | None:
    """The rank's ``memory:`` in the placement, else a GPU's memory where it can be read; None where unknown."""
    if spec.memory is None and spec.device != "cpu" and device_memory is not None:
        return device_memory(spec.device)
    return spec.memory
