"""Loop cohorts: every request's instance of one loop, stepped together inside the compute thread.

Per request and iteration, the per-firing dataflow pays for a Firing, its
futures, the hand-over to this thread and back, routing and the stop rule;
for a decode loop that is most of the runtime's cost. A cohort runs the body
of a qualifying loop (``cohort_plan``) for all its members at once:

    step:  for each stage of the body (nodes independent of each other), one
           engine call for every member and every node of the stage that
           engine runs (``Engine.run_groups``: the CFG passes of a flow step
           are one forward); engines without groups get one Firing per member
           and are stepped as usual, the step waits for their results
           then, per member: carries move on, the stop rule or the bound says
           whether the iteration counts, exposed outputs are reported
    join:  a member enters at iteration 0 with the values captured from
           outside the loop (futures of launched firings resolve here first)
    end:   a member leaves with its exposed count, its exit values and whether
           it hit the bound; the walk on the main thread goes on from there

The stop rule is applied before the next step, so a cohort never runs an
iteration that does not count: no speculation and nothing wasted. One
``CohortReport`` per step goes back to the main thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from walkserve.engines.base import Engine, Firing, FiringResult, Group
from walkserve.engines.kv.ops import bind as bind_kv
from walkserve.worker.cohort_plan import CUR, FIXED, CohortPlan
from walkserve.worker.future import FAILED, PENDING, Future

log = logging.getLogger(__name__)

_MISSING = object()


class Member:
    """One request's instance of the loop."""

    __slots__ = ("bound", "cur", "dead", "entry", "exits", "k", "node_sampling", "outer", "params", "prev",
                 "request_id", "sampling")

    def __init__(self, request_id: str, outer: tuple, bound: int, params: Any, sampling: Any, entry: dict,
                 node_sampling: Any = None):
        self.request_id, self.outer, self.bound = request_id, outer, bound
        self.params, self.sampling = params, sampling
        self.node_sampling = node_sampling  # node -> SamplingParams overriding ``sampling`` (None: none)
        self.entry = entry  # (consumer, slot) -> value captured from outside the loop
        self.k = 0
        self.cur: dict[str, dict[str, Any]] = {}  # node -> its outputs of this iteration (shared: never written into)
        self.prev: dict[tuple[str, str], Any] = {}  # (consumer, slot) -> the value a carry slot reads
        self.exits: dict[Any, list] = {}
        self.dead = False


@dataclass
class CohortReport:
    walk: str
    scope: str
    # (node, out, modality) -> ([request], [path], [value]) of the exposed iterations
    client: dict = field(default_factory=dict)
    ended: list = field(default_factory=list)  # (request, outer, exposed n, firings per node, hit bound, [(route, values)])
    failed: list = field(default_factory=list)  # (request, error)
    firings: int = 0

    def merge(self, later: CohortReport) -> None:
        """Append a later step's report (a request's rows stay in step order, before its end)."""
        for key, (rids, paths, values) in later.client.items():
            rows = self.client.get(key)
            if rows is None:
                self.client[key] = (rids, paths, values)
            else:
                rows[0].extend(rids)
                rows[1].extend(paths)
                rows[2].extend(values)
        self.ended.extend(later.ended)
        self.failed.extend(later.failed)
        self.firings += later.firings


class Cohort:
    def __init__(self, plan: CohortPlan, engines: dict[str, Engine], firing_id: Callable[[Cohort], int],
                 account: Callable[[str, float, int], None] | None = None):
        """``firing_id(cohort)`` numbers a Firing this cohort submits (the compute thread routes its result back);
        ``account(component, seconds, firings)``, when given, is told of every engine call that runs groups
        (the compute thread's busy time per component; its own steps count the other firings)."""
        self.plan, self.engines, self.firing_id, self.account = plan, engines, firing_id, account
        self.members: list[Member] = []
        self.joining: list[Member] = []
        self.stage: int | None = None  # the body stage being run, None between steps
        self.issued = False
        self.batch: list[Member] = []
        self.pending: dict[int, tuple[Member, str]] = {}  # firing id -> (member, component)
        self.report = CohortReport(plan.walk, plan.scope)

    # ---- membership ----------------------------------------------------------------------------
    def join(self, member: Member) -> None:
        self.joining.append(member)

    def release(self, request_id: str) -> None:
        for m in self.members + self.joining:
            if m.request_id == request_id:
                m.dead = True
        self.joining = [m for m in self.joining if not m.dead]
        self.pending = {fid: p for fid, p in self.pending.items() if not p[0].dead}

    def has_work(self) -> bool:
        return bool(self.members or self.joining)

    def _admit(self) -> None:
        waiting = []
        for m in self.joining:
            states = {v.state for v in m.entry.values() if isinstance(v, Future)}
            if FAILED in states:
                self._fail(m, "an input of this loop failed")
            elif PENDING in states:
                waiting.append(m)
            else:
                for key, v in m.entry.items():
                    if isinstance(v, Future):
                        m.entry[key] = v.value
                for key, _, _ in self.plan.carries:
                    m.prev[key] = m.entry[key]
                self.members.append(m)
        self.joining = waiting

    # ---- stepping ------------------------------------------------------------------------------
    def advance(self) -> CohortReport | None:
        """Run as far as possible: a finished step's report, or None (idle, or waiting on an engine)."""
        if self.stage is None:
            self._admit()
            self.members = [m for m in self.members if not m.dead]
            if not self.members:
                return self._take_report() if self.report.failed else None
            self.stage, self.issued, self.batch = 0, False, list(self.members)
        stages = self.plan.stages
        while self.stage < len(stages):
            if self.issued:
                if self.pending:
                    return None
                self.stage, self.issued = self.stage + 1, False
                continue
            self._issue_stage(stages[self.stage])
            self.issued = True
        self._finish()
        self.stage = None
        return self._take_report()

    def _take_report(self) -> CohortReport:
        report, self.report = self.report, CohortReport(self.plan.walk, self.plan.scope)
        return report

    def _issue_stage(self, stage: tuple[str, ...]) -> None:
        """Every node of the stage for every live member; nodes on one group engine go in one call."""
        by_engine: dict[str, list[tuple[str, list[Member], Group]]] = {}
        for node in stage:
            issued = self._issue(node)
            if issued is not None:
                by_engine.setdefault(self.plan.specs[node].component, []).append((node, *issued))
        for component, groups in by_engine.items():
            engine, t0 = self.engines[component], time.perf_counter()
            try:
                results = engine.run_groups([g for _, _, g in groups]) if len(groups) > 1 else [engine.run_group(groups[0][2])]
            except Exception as e:
                log.exception("engine %s failed a group", component)
                results = [[f"engine {component!r} failed: {type(e).__name__}: {e}"] * len(g.request_ids) for _, _, g in groups]
            if self.account is not None:
                self.account(component, time.perf_counter() - t0, sum(len(g.request_ids) for _, _, g in groups))
            for (node, alive, _), outs in zip(groups, results):
                self._store_group(node, alive, outs)

    def _store_group(self, node: str, alive: list[Member], results: list) -> None:
        component = self.plan.specs[node].component
        if len(results) != len(alive):
            results = [f"engine {component!r} returned {len(results)} results for {len(alive)} firings"] * len(alive)
        for m, out in zip(alive, results):
            if m.dead:  # failed by another node of the stage
                continue
            if type(out) is dict:
                m.cur[node] = out
            else:
                self._store(m, node, out)

    def _issue(self, node: str) -> tuple[list[Member], Group] | None:
        """The node for every live member: a Group for an engine that runs groups (returned, not yet run),
        else one submitted Firing per member."""
        spec, slots = self.plan.specs[node], self.plan.slots[node]
        alive, inputs = [], []
        for m in self.batch:
            if m.dead:
                continue
            try:
                inputs.append(self._inputs(m, slots))
            except KeyError:
                src, out = _missing(m, slots)
                self._fail(m, f"node {src!r} returned no output {out!r}, which node {node!r} reads")
                continue
            alive.append(m)
        if not alive:
            return None
        engine = self.engines[spec.component]
        if getattr(engine, "kv_contexts", False):
            alive, inputs, kv = self._bind(node, spec.params, alive, inputs)
            if not alive:
                return None
        self.report.firings += len(alive)
        if engine.runs_groups:
            return alive, Group(
                self.plan.walk, node, spec.component, spec.op, spec.outputs, spec.params,
                [m.request_id for m in alive], [(*m.outer, m.k) for m in alive], inputs,
                [m.params for m in alive], [_sampling(m, node) for m in alive],
                kv if getattr(engine, "kv_contexts", False) else None,
            )
        for m, inp in zip(alive, inputs, strict=True):
            firing = Firing(
                self.firing_id(self), m.request_id, self.plan.walk, node, spec.component, spec.op,
                (*m.outer, m.k), inp, spec.outputs, m.params, _sampling(m, node), spec.params,
            )
            self.pending[firing.id] = (m, spec.component)
            engine.submit(firing)
        return None

    def _bind(self, node: str, params: Any, alive: list[Member], inputs: list[dict]) -> tuple[list, list, list]:
        """Each member's context operations bound to its inputs (a member whose inputs do not fit fails)."""
        kept, kept_inputs, kv = [], [], []
        for m, inp in zip(alive, inputs):
            try:
                kv.append(bind_kv(node, params, inp))
            except ValueError as e:
                self._fail(m, f"{self.plan.specs[node].component}: {e}")
                continue
            kept.append(m)
            kept_inputs.append(inp)
        return kept, kept_inputs, kv

    @staticmethod
    def _inputs(m: Member, slots: tuple) -> dict[str, Any]:
        cur, inputs = m.cur, {}
        for slot, how, a, b in slots:
            if how == CUR:
                inputs[slot] = cur[a][b]
            elif how == FIXED:
                inputs[slot] = m.entry[a]
            else:
                inputs[slot] = m.prev[a]
        return inputs

    def _store(self, m: Member, node: str, outputs: dict | str) -> None:
        """Keep a node's outputs; one an engine left out is simply not there (as per firing)."""
        if isinstance(outputs, dict):
            m.cur[node] = outputs
        else:
            self._fail(m, outputs if isinstance(outputs, str) else f"node {node!r} returned {type(outputs).__name__}, not outputs")

    def on_result(self, result: FiringResult) -> None:
        """A result of a firing this cohort submitted to an engine without ``run_group``."""
        entry = self.pending.pop(result.firing.id, None)
        if entry is None or entry[0].dead:
            return
        if result.error is not None:
            self._fail(entry[0], result.error)
        else:
            self._store(entry[0], result.firing.node, result.outputs or {})

    def engine_failed(self, component: str, error: str) -> None:
        """An engine raised in a step: the members waiting on it fail."""
        for fid, (m, comp) in list(self.pending.items()):
            if comp == component:
                del self.pending[fid]
                if not m.dead:
                    self._fail(m, error)

    def _fail(self, m: Member, error: str) -> None:
        m.dead = True
        self.report.failed.append((m.request_id, error))

    def _finish(self) -> None:
        """The step ran for every live member: carries, the stop rule, exposed outputs, ended members."""
        plan, report = self.plan, self.report
        stop, client, exits, carries = plan.stop, plan.client, plan.exits, plan.carries
        rows = report.client
        for m in self.batch:
            if m.dead:
                continue
            cur, k = m.cur, m.k
            end, hit = None, False
            if stop is not None:
                node, out, rule = stop
                value = cur[node].get(out, _MISSING)
                if value is _MISSING:
                    self._fail(m, f"node {node!r} returned no output {out!r}, which the stop rule of loop {plan.scope!r} reads")
                    continue
                try:
                    stopping = rule.should_stop(value, m.params, k)
                except Exception as e:
                    self._fail(m, f"stop rule of loop {plan.scope!r} failed: {type(e).__name__}: {e}")
                    continue
                if stopping:
                    end = k + 1 if rule.include_stopping else k
                elif k + 1 >= m.bound:
                    end, hit = k + 1, True
            elif k + 1 >= m.bound:
                end = k + 1
            if end is None or k < end:
                path = (*m.outer, k)
                for key in client:
                    value = cur[key[0]].get(key[1], _MISSING)
                    if value is _MISSING:
                        continue
                    r = rows.get(key)
                    if r is None:
                        r = rows[key] = ([], [], [])
                    r[0].append(m.request_id)
                    r[1].append(path)
                    r[2].append(value)
                for node, out, route, last in exits:
                    value = cur[node].get(out, _MISSING)
                    if value is _MISSING:
                        continue
                    if last:
                        m.exits[route] = [value]
                    else:
                        m.exits.setdefault(route, []).append(value)
            m.k = k + 1
            if end is not None:
                m.dead = True
                ended = [(route, m.exits.get(route, [])) for _, _, route, _ in exits]
                report.ended.append((m.request_id, m.outer, end, m.k, hit, ended))
                continue
            prev = m.prev
            for key, node, out in carries:
                value = cur[node].get(out, _MISSING)
                if value is _MISSING:
                    self._fail(m, f"node {node!r} returned no output {out!r}, which the carry of loop {plan.scope!r} reads")
                    break
                prev[key] = value


def _sampling(m: Member, node: str) -> Any:
    """The member's sampling for ``node``: its per-node entry, else the request's."""
    return m.node_sampling.get(node, m.sampling) if m.node_sampling else m.sampling


def _missing(m: Member, slots: tuple) -> tuple[str, str]:
    """The first same-iteration output a node's slots read that is not there (for an error message)."""
    return next((a, b) for _, how, a, b in slots if how == CUR and b not in m.cur.get(a, {}))
