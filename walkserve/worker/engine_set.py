"""The rank's engines, as the executor drives them: one call per step's groups, with its accounting.

    call      one engine call (``Engine.run_groups``) for groups of one step; per group,
              its members' results (an engine that raises or miscounts fails the members)
    release   a request ended: every engine frees its state

Busy seconds, calls and items (members answered; one answered LATER counts when it
is answered) per component feed the rank's stats; each call's seconds per node and
batch size feed ``costs`` (``step_costs.StepCosts``, read by the deadline scheduler); with a ``timing``
log, each call is also one ``node`` record per group (its node, walk, members and the call's batch).
This module knows engines and groups, nothing of cohorts.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping

from walkserve.engines.base import Engine, Group
from walkserve.protocol.timing import TimingLog
from walkserve.worker.step_costs import StepCosts

log = logging.getLogger(__name__)


class EngineSet:
    def __init__(self, engines: Mapping[str, Engine], clock: Callable[[], float] = time.perf_counter):
        self.engines, self.clock = dict(engines), clock
        self.costs = StepCosts()
        self.busy_s: dict[str, float] = defaultdict(float)
        self.steps: dict[str, int] = defaultdict(int)
        self.items: dict[str, int] = defaultdict(int)
        self.timing: TimingLog | None = None  # set by the worker when timing records are on

    def __getitem__(self, component: str) -> Engine:
        return self.engines[component]

    def call(self, engine: Engine, groups: list[Group], may_yield: bool = False) -> list[list]:
        """Per group, its members' results (an engine that raises or miscounts fails the members).
        ``may_yield``: one group whose members may be answered LATER (offered again in a later pass)."""
        component = groups[0].component
        t0, start = self.clock(), time.time_ns() if self.timing is not None else 0
        try:
            results = engine.run_groups(groups, may_yield=may_yield)
        except Exception as e:
            log.exception("engine %s failed a group", component)
            return [[f"engine {component!r} failed: {type(e).__name__}: {e}"] * len(g.request_ids) for g in groups]
        seconds = self.clock() - t0
        self.busy_s[component] += seconds
        self._observe(groups, seconds)
        self.steps[component] += 1
        if self.timing is not None:
            self._record(groups, component, start)
        if len(results) != len(groups):
            results = [[]] * len(groups)
        out = [r if len(r) == len(g.request_ids) else
               [f"engine {component!r} returned {len(r)} results for {len(g.request_ids)} firings"] * len(g.request_ids)
               for g, r in zip(groups, results)]
        self.items[component] += sum(len(r) for r in out)
        return out

    def _observe(self, groups: list[Group], seconds: float) -> None:
        """The call's seconds, for each node in it at its members' count (a call of several nodes: each the whole
        as its step's time, its members' share as its busy time)."""
        batch: dict[str, int] = {}
        for g in groups:
            batch[g.node] = batch.get(g.node, 0) + len(g.request_ids)
        total = sum(batch.values()) or 1
        for node, n in batch.items():
            self.costs.observe(node, n, seconds, seconds * n / total)

    def _record(self, groups: list[Group], component: str, start: int) -> None:
        end, batch = time.time_ns(), sum(len(g.request_ids) for g in groups)
        for g in groups:
            self.timing.add("node", g.node, g.walk, start, end, g.request_ids, {"component": component, "batch": batch})

    def unanswered(self, component: str, n: int) -> None:
        """``n`` members of the last call were answered LATER: they count when they are answered."""
        self.items[component] -= n

    def release(self, rid: str) -> None:
        """The request ended: every engine frees its state."""
        for engine in self.engines.values():
            try:
                engine.release(rid)
            except Exception:
                log.exception("engine %s failed to release %s", engine.component, rid)
