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
from typing import TYPE_CHECKING, Any

from walkserve.placement.choice import walk_here

if TYPE_CHECKING:
    from walkserve.worker.executor import Executor
    from walkserve.worker.state import WalkRun

log = logging.getLogger(__name__)


def next_walk_here(ex: Executor, run: WalkRun) -> tuple[str, dict[str, int], dict[str, Any]] | None:
    """(walk, ranks, inputs) of the request's next walk if it runs wholly on this rank, else None."""
    req, graph = run.request, ex.graph
    if req.spec is None or ex.placement is None or ex.convert is None:
        return None
    to_array, to_tensor = ex.convert
    outputs = {name: to_array(value) for name, value in run.outputs.items()}
    try:
        start = graph.state_machine.next(req.spec, run.walk, outputs)
        if start is None:
            return None
        graph.check_start(start)
    except Exception:
        log.debug("state machine of %s raised; the conductor reports it", req.id, exc_info=True)
        return None
    ranks = walk_here(ex.placement, graph.plans[start.walk], ex.rank, req.sticky)
    if ranks is None:
        return None
    return start.walk, ranks, {name: to_tensor(value) for name, value in start.inputs.items()}
