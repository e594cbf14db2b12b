"""Handing a loop instance to its cohort, and taking the walk on from where the cohort left it.

A mixin of WalkState; it reads and writes the walk state's fields. When a
node of a cohort loop (``cohort_plan``) whose whole body sits on this rank
would fire iteration 0 of an instance, the instance goes to the compute
thread's cohort instead, once every value it reads from outside the loop is
here (futures of launched firings count) and the iteration is certain, not
speculative. The body's cursors wait at iteration 0 until the cohort reports
the instance's end; then the loop ends as if its iterations had run here.
"""

from __future__ import annotations

from typing import Any

from walkserve.worker.plan_index import Path, value_key

_MISSING = object()


class CohortSide:
    def _init_cohorts(self, enabled: bool) -> None:
        self.in_cohort: set[tuple[str, Path]] = set()  # loop instances a cohort is running
        self._cohort_plans = {}
        if enabled and hasattr(self.sink, "join"):
            for sid, cp in self.idx.cohorts.items():
                if all(self.ranks.get(n) == self.rank for n in cp.nodes):
                    self._cohort_plans[sid] = cp
        self._cohort_of = {n: sid for sid, cp in self._cohort_plans.items() for n in cp.nodes}

    def _to_cohort(self, node: str, path: Path, speculative: bool) -> bool:
        """True: ``node`` must not fire at ``path`` here (its instance runs, or will run, in a cohort)."""
        sid = self._cohort_of[node]
        cp = self._cohort_plans[sid]
        outer = path[: cp.depth]
        if (sid, outer) in self.in_cohort:
            return True
        if path[cp.depth] != 0:
            return False
        if speculative:
            return True  # an enclosing loop may not run this iteration: wait until it is known
        entry, read = {}, []
        at = (*outer, 0)
        for key, recipe in cp.entry:
            vkey = value_key(recipe, at)
            value = self.values.get(vkey, _MISSING)
            if value is _MISSING:
                return True
            entry[key] = value
            read.append(vkey)
        if self.reads_left:
            self._read(read)
        self.in_cohort.add((sid, outer))
        self.sink.join(self, cp, outer, self._bound(sid), entry)
        return True

    def cohort_ended(self, scope: str, outer: Path, n: int, fired: int, hit_bound: bool, exits: list) -> None:
        """The cohort ran ``fired`` iterations of this instance, of which the first ``n`` count."""
        self._guard(self._cohort_ended, scope, tuple(outer), n, fired, hit_bound, exits)

    def _cohort_ended(self, scope: str, outer: Path, n: int, fired: int, hit_bound: bool, exits: list[tuple[Any, list]]) -> None:
        cp = self._cohort_plans[scope]
        self.in_cohort.discard((scope, outer))
        for node in cp.nodes:
            self.fired[node] += fired
            self.cursor[node] = (*outer, fired)
        if hit_bound:
            self.hit_bound.add(cp.stop[0])
        for route, values in exits:
            self._exit_value(route, 0, outer, self._combine(route, scope, values))
        self._claim_end(scope, outer, n, False)
