"""A walk transition on the worker: when a walk ran wholly here, its next walk may start here too.

The model's state machine is torch-free and deterministic, so the worker can
ask it what the conductor would: with the walk's outputs, which walk comes
next. If every node of that walk goes to this rank by the placement's rule
(``placement.choice.walk_here``), the walk starts at once and the conductor is
told (WalkStarted) instead of asked; no round trip sits between, say, a
prefill and its decode. Anything else (no next walk, another rank, an error in
the state machine) is left to the conductor, which asks the same question.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from walkserve.placement.choice import walk_here

if TYPE_CHECKING:
    from walkserve.graph.walk import WalkGraph
    from walkserve.placement.plan import Placement
    from walkserve.worker.state import WalkRun

Convert = tuple[Callable[[Any], Any], Callable[[Any], Any]]  # (to_array, to_tensor)

log = logging.getLogger(__name__)


def next_walk_here(
    graph: WalkGraph, placement: Placement | None, convert: Convert | None, rank: int, run: WalkRun,
) -> tuple[str, dict[str, int], dict[str, Any]] | None:
    """(walk, ranks, inputs) of the request's next walk if it runs wholly on ``rank``, else None.

    A pure function of what it is given: the graph's state machine, the placement's rule and the
    finished walk (its request and outputs)."""
    req = run.request
    if req.spec is None or placement is None or convert is None:
        return None
    to_array, to_tensor = convert
    outputs = {name: to_array(value) for name, value in run.outputs.items()}
    try:
        start = graph.state_machine.next(req.spec, run.walk, outputs)
        if start is None:
            return None
        graph.check_start(start)
    except Exception:
        log.debug("state machine of %s raised; the conductor reports it", req.id, exc_info=True)
        return None
    ranks = walk_here(placement, graph.plans[start.walk], rank, req.sticky)
    if ranks is None:
        return None
    return start.walk, ranks, {name: to_tensor(value) for name, value in start.inputs.items()}
