"""A gathering engine's call after the pass: every cohort's groups, cut to one step of each node.

The cohorts hand a gathering engine (``Engine.gathers``) every ready member;
after the pass, its call takes per node at most the engine's ``step_capacity``,
chosen across all cohorts by the deadline scheduler's rule
(``Deadlines.pick_across``: least slack first, first chunks, pacing), so the
batch bounds the call and not each cohort's share. A member left out goes back
to RUNNING (``Member.deferred``) and is offered its unit at the next pass.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from walkserve.engines.base import Group
from walkserve.worker.deadlines import Deadlines
from walkserve.worker.effects import Effects
from walkserve.worker.group import subset
from walkserve.worker.local import NodeUnit
from walkserve.worker.state import Member


class Call(NamedTuple):
    """One unit's part of an engine call: its members and their group (and, gathered, the cohort it is from)."""

    unit: NodeUnit
    members: list[Member]
    group: Group
    cohort: Any = None  # the Cohort it is from (this module is below cohort.py)


def pick_gathered(deadlines: Deadlines, fx: Effects, calls: list[Call], capacity: int | None) -> list[Call]:
    """The calls cut to the members one step of each node takes; the others wait for the next pass."""
    by_node: dict[str, list[Call]] = {}
    for c in calls:
        by_node.setdefault(c.unit.node.name, []).append(c)
    kept = []
    for node_calls in by_node.values():
        live = [(c.unit.node, m) for c in node_calls for m in c.members if m.live]  # one may have failed since
        take, wait = deadlines.pick_across([n for n, _ in live], [m for _, m in live], capacity)
        if not wait:
            kept.extend(node_calls)
            continue
        for m in wait:
            m.deferred()
            fx.touch(m.cohort)
        order = {id(m): i for i, m in enumerate(take)}
        for c in node_calls:
            rows = sorted((j for j, m in enumerate(c.members) if id(m) in order), key=lambda j: order[id(c.members[j])])
            if rows:
                kept.append(Call(c.unit, [c.members[j] for j in rows], subset(c.group, rows), c.cohort))
    return kept
