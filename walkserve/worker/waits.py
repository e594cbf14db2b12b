"""Whether a member has what a unit waits for: the values of other ranks, stream chunks, a child's entries.

A cohort asks this of every member at a unit whose reads may not be here
yet (``NodeUnit.waits``, ``ChildUnit.waits``), each pass; the check is built
once per unit, and the common case (one value of this iteration or of the
last) is a dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable

from walkserve.worker.local import ChildUnit, NodeUnit
from walkserve.worker.program import CARRY, CUR
from walkserve.worker.state import Member


def has_check(unit: NodeUnit | ChildUnit) -> Callable[[Member], bool] | None:
    """Whether everything ``unit`` waits for is here for a member (None: it waits for nothing). One value of this
    iteration or of the last, the common case, is looked up inline."""
    waits = unit.waits
    if not waits:
        return None
    if type(unit) is ChildUnit:
        return lambda m: all(k[0] in m.cur and k[1] in m.cur[k[0]] for k in waits)
    if len(waits) == 1 and waits[0].kind is CUR:
        node, output = waits[0].node, waits[0].output

        def this_iteration(m: Member) -> bool:
            values = m.cur.get(node)
            return values is not None and output in values
        return this_iteration
    if len(waits) == 1 and waits[0].kind is CARRY:
        node, output = waits[0].node, waits[0].output

        def last_iteration(m: Member) -> bool:
            if not m.k:  # iteration 0 reads the carry's initial entry
                return True
            values = m.prev.get(node)
            return values is not None and output in values
        return last_iteration

    def every(m: Member) -> bool:
        for r in waits:
            kind = r.kind
            if kind is CUR:
                values = m.cur.get(r.node)
            elif kind is CARRY:
                if not m.k:
                    continue
                values = m.prev.get(r.node)
            else:
                if m.run.stream_in(r.stream, m.outer).buffer.chunk(m.k) is None:
                    return False
                continue
            if values is None or r.output not in values:
                return False
        return True
    return every
