"""A virtual cluster in one process: every rank's dataflow, messages delivered in a random order.

The simulator drives the same WalkState and RequestRun the real worker and
conductor use, but replaces processes and sockets with in-memory channels.
Messages between a pair of endpoints stay in order (as ZeroMQ keeps them);
everything else (which channel moves next, when a firing completes, whether a
launched firing exposes futures first) is drawn from a seeded RNG. Running
many requests this way against the reference executor checks the dataflow
semantics under interleavings that real processes rarely produce. With
``cohorts``, qualifying loops run in per-rank loop cohorts as in the worker:
joins, cohort steps and their reports are channel messages like the others.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from walkserve.conductor.request_run import RequestRun, safe_advance
from walkserve.core.request import RequestSpec
from walkserve.engines.base import Engine, Firing, FiringResult, Group
from walkserve.engines.values import concat, to_array, to_tensor
from walkserve.graph.walk import WalkGraph
from walkserve.testing.reference import ClientOutput, ReferenceResult
from walkserve.worker.cohort import Cohort, CohortReport, Member
from walkserve.worker.dataflow import WalkState


class _Future:
    def __init__(self):
        self.value: Any = None
        self.ready = False


@dataclass
class SimStats:
    firings: int = 0
    speculative: int = 0
    wasted: int = 0
    messages: int = 0
    max_wasted_per_node: int = 0  # over every (request, walk, node, loop instance)


class GroupOnlyEngine(Engine):
    """An engine that only runs loop cohorts' groups (``run_group``); never given single firings.

    For the simulator and for tests of cohorts: subclasses implement ``run_group``.
    """

    runs_groups = True

    def submit(self, firing: Firing) -> None:
        raise AssertionError(f"{type(self).__name__} runs groups only")

    def step(self) -> list[FiringResult]:
        return []

    def has_work(self) -> bool:
        return False

    def release(self, request_id: str) -> None:
        pass


class _GroupEngine(GroupOnlyEngine):
    """A cohort's engine in the simulator: each member through the component's ``forward_batch`` alone."""

    def __init__(self, component: str, module: Any):
        self.component, self.module = component, module

    def run_group(self, group: Group) -> list:
        out = []
        for rid, path, inputs, params in zip(group.request_ids, group.paths, group.inputs, group.params, strict=True):
            firing = Firing(0, rid, group.walk, group.node, group.component, group.op, path, inputs, group.outputs, params, None, group.node_params)
            try:
                out.append(self.module.forward_batch([firing])[0])
            except Exception as e:
                out.append(f"node {group.node!r} failed: {type(e).__name__}: {e}")
        return out


@dataclass
class _Rank:
    states: dict[tuple[str, str], WalkState] = field(default_factory=dict)
    early: dict[tuple[str, str], list] = field(default_factory=lambda: defaultdict(list))


class Simulator:
    """Run requests through a virtual cluster. ``ranks_of(walk, node) -> rank`` places nodes."""

    def __init__(
        self,
        graph: WalkGraph,
        components: Mapping[str, Any],
        ranks_of,
        seed: int = 0,
        futures: bool = True,
        speculate: bool = True,
        cohorts: bool = False,
    ):
        self.speculate, self.cohorts = speculate, cohorts
        self.group_engines = {name: _GroupEngine(name, module) for name, module in components.items()}
        self.cohort_of: dict[tuple, Cohort] = {}  # (rank, walk, scope) -> that rank's cohort
        self.graph = graph
        self.components = components
        self.ranks_of = ranks_of
        self.rng = random.Random(seed)
        self.futures = futures
        self.ranks: dict[int, _Rank] = defaultdict(_Rank)
        self.channels: dict[tuple, deque] = defaultdict(deque)  # (src, dst) -> messages in order
        self.runs: dict[str, RequestRun] = {}
        self.results: dict[str, ReferenceResult] = {}
        self.stats = SimStats()

    # ---- the sink each WalkState writes to ---------------------------------------------------
    def fire(self, ws, node, path, inputs, spans, speculative):
        self.stats.firings += 1
        self.stats.speculative += speculative
        futures = {out: _Future() for out in ws.plan.nodes[node].outputs}
        pending = ("fire", ws, node, path, inputs, spans, futures)
        self.channels[(("compute", ws.rank), ("rank", ws.rank))].append(pending)
        if self.futures and self.rng.random() < 0.7:
            ws.launched(node, path, futures)

    def send(self, rank, kind, ws, **fields):
        self.stats.messages += 1
        self.channels[(("rank", ws.rank), ("rank", rank))].append((kind, ws.request_id, ws.walk, fields))

    def report(self, kind, ws, **fields):
        self.channels[(("rank", ws.rank), "conductor")].append((kind, ws.request_id, ws.walk, fields))

    def join(self, ws, plan, outer, bound, entry):
        member = Member(ws.request_id, outer, bound, ws.params, None, entry)
        self.channels[(("main", ws.rank), ("compute", ws.rank))].append(("join", (ws.rank, plan.walk, plan.scope), plan, member))

    # ---- loop cohorts (the compute thread's side, then the main thread's) ----------------------
    def _cohort_message(self, key, msg) -> None:
        kind, ckey = msg[0], msg[1]
        if kind == "join":
            plan, member = msg[2], msg[3]
            if any(isinstance(v, _Future) and not v.ready for v in member.entry.values()):
                self.channels[key].append(msg)  # a launched firing it reads has not run yet: later
                return
            member.entry = {k: (v.value if isinstance(v, _Future) else v) for k, v in member.entry.items()}
            cohort = self.cohort_of.get(ckey)
            if cohort is None:
                cohort = self.cohort_of[ckey] = Cohort(plan, self.group_engines, lambda cohort: 0)
            cohort.join(member)
            self.channels[(("compute", ckey[0]), ("compute", ckey[0]))].append(("step", ckey))
            return
        cohort = self.cohort_of[ckey]
        for m in cohort.members + cohort.joining:
            run = self.runs[m.request_id]
            if run.finished is not None or run.error is not None:
                cohort.release(m.request_id)
        report = cohort.advance()
        if report is not None:
            self.stats.firings += report.firings
            self.channels[(("compute", ckey[0]), ("rank", ckey[0]))].append(("report", ckey, report))
        if cohort.has_work():
            self.channels[key].append(("step", ckey))

    def _cohort_report(self, rank: int, report: CohortReport) -> None:
        states = self.ranks[rank].states
        for (node, out, modality), (rids, paths, values) in report.client.items():
            for rid, path, value in zip(rids, paths, values, strict=True):
                ws = states.get((rid, report.walk))
                if ws is not None and not ws.failed:
                    self.report("client", ws, node=node, modality=modality, path=path, value=value, output=out)
        for rid, error in report.failed:
            ws = states.get((rid, report.walk))
            if ws is not None and not ws.failed:
                ws.failed = True
                self.report("failed", ws, error=error)
        for rid, outer, n, fired, hit_bound, exits in report.ended:
            ws = states.get((rid, report.walk))
            if ws is not None:
                ws.cohort_ended(report.scope, outer, n, fired, hit_bound, exits)

    # ---- driving ---------------------------------------------------------------------------
    def submit(self, spec: RequestSpec) -> None:
        cache: dict[tuple, int] = {}

        def choose(walk: str, node: str) -> int:
            return cache.setdefault((walk, node), self.ranks_of(walk, node))

        run = RequestRun(spec, self.graph, choose)
        self.runs[spec.id] = run
        self.results[spec.id] = ReferenceResult()
        messages, error = safe_advance(run, run.begin)
        self._start_walk(run, messages, error)

    def run(self, max_steps: int = 1_000_000) -> dict[str, ReferenceResult]:
        for _ in range(max_steps):
            live = [k for k, q in self.channels.items() if q]
            if not live:
                break
            key = self.rng.choice(live)
            self._handle(key, self.channels[key].popleft())
        unfinished = [r for r in self.runs.values() if r.finished is None and r.error is None]
        if unfinished:
            raise RuntimeError(f"simulation stalled with {len(unfinished)} unfinished request(s): {[r.id for r in unfinished]}")
        return self.results

    def _handle(self, key, msg) -> None:
        kind = msg[0]
        if kind == "fire":
            self._complete(*msg[1:])
        elif kind in ("join", "step"):
            self._cohort_message(key, msg)
        elif kind == "report":
            self._cohort_report(key[1][1], msg[2])
        elif key[1] == "conductor":
            self._conductor(msg)
        else:
            self._worker(key[1][1], msg)

    def _complete(self, ws, node, path, inputs, spans, futures) -> None:
        resolved = {k: (v.value if isinstance(v, _Future) else v) for k, v in inputs.items()}
        if any(isinstance(v, _Future) and not v.ready for v in inputs.values()):
            raise AssertionError(f"{node}{path} consumed a future that was not computed first")
        n = ws.plan.nodes[node]
        firing = Firing(0, ws.request_id, ws.walk, node, n.component, n.op, path, resolved, n.outputs, ws.params, None, n.params, spans)
        run = self.runs[ws.request_id]
        if run.finished is not None or run.error is not None:
            return
        try:
            outputs = self.components[n.component].forward_batch([firing])[0]
        except Exception as e:
            self._fail(run, f"node {node!r} failed: {type(e).__name__}: {e}")
            return
        for out, fut in futures.items():
            fut.value, fut.ready = outputs[out], True
        ws.completed(node, path, outputs)

    def _worker(self, rank: int, msg) -> None:
        kind, rid, walk, fields = msg
        run = self.runs[rid]
        if run.finished is not None or run.error is not None:
            return
        ws = self.ranks[rank].states.get((rid, walk))
        if ws is None:
            self.ranks[rank].early[(rid, walk)].append(msg)
            return
        if kind == "deliver":
            ws.deliver(fields["node"], fields["output"], fields["path"], fields["value"])
        elif kind == "item":
            ws.stream_item(fields["stream"], fields["prefix"], fields["index"], fields["value"])
        elif kind == "end":
            ws.stream_end(fields["stream"], fields["prefix"], fields["n_items"])
        elif kind == "loop":
            ws.loop_event(fields["scope"], fields["outer"], fields["k"], fields["end"])
        elif kind == "flow":
            ws.flow(fields["stream"], fields["prefix"], fields["pause"])

    def _conductor(self, msg) -> None:
        kind, rid, walk, fields = msg
        run, result = self.runs[rid], self.results[rid]
        if run.finished is not None or run.error is not None:
            return
        if kind == "failed":
            self._fail(run, fields["error"])
            return
        if kind == "client":
            value = fields["value"]
            result.outputs.append(ClientOutput(fields["modality"], walk, fields["node"], tuple(fields["path"]), value))
            return
        if kind == "output":
            complete = run.walk_output(walk, fields["name"], to_array(fields["value"]))
        else:
            complete = run.node_done(walk, fields["node"], fields["firings"], fields["hit_bound"])
        if complete:
            for r in self.ranks.values():
                st = r.states.get((rid, walk))
                if st is not None:
                    self.stats.wasted += sum(st.wasted.values())
                    self.stats.max_wasted_per_node = max(self.stats.max_wasted_per_node, *st.wasted.values(), 0)
            result.walks.append(walk)
            result.walk_outputs.append(dict(run.outputs))
            messages, error = safe_advance(run, run.advance)
            self._start_walk(run, messages, error)

    def _start_walk(self, run: RequestRun, messages, error) -> None:
        result = self.results[run.id]
        if error:
            self._fail(run, error)
            return
        if run.finished is not None:
            result.finish = run.finished
            return
        for rank, start in messages:
            plan = self.graph.plans[start.walk]
            ws = WalkState(plan, run.id, rank, start.ranks, start.params, self, concat, self.speculate, self.cohorts)
            self.ranks[rank].states[(run.id, start.walk)] = ws
            inputs = {k: to_tensor(_plain(v)) for k, v in start.inputs.items()}
            ws.start(inputs)
            for early in self.ranks[rank].early.pop((run.id, start.walk), []):
                self._worker(rank, early)

    def _fail(self, run: RequestRun, error: str) -> None:
        from walkserve.core.finish import FinishReason

        run.error = error
        self.results[run.id].finish = FinishReason.ERROR
        self.results[run.id].error = error


def _plain(v):
    from walkserve.protocol.arrays import plain_value

    return plain_value(v)
