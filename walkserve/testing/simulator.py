"""A virtual cluster in one process: every rank's executor, messages delivered in a random order.

The simulator drives the same Executor the worker's heartbeat runs and the same
RequestRun the conductor keeps, but replaces processes and sockets with
in-memory channels. Messages between a pair of endpoints stay in order (as
ZeroMQ keeps them); everything else is drawn from a seeded RNG: which channel
delivers next, when a rank takes a pass over its cohorts, and, per rank and
component, whether the engine answers a whole group at once or a random few
of its members per call (the others ``LATER``, offered again in later passes,
as a long prefill is). Running many requests this
way against the reference executor checks the executor's semantics under
interleavings real processes rarely produce.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from walkserve.conductor.request_run import RequestRun, safe_advance
from walkserve.core.finish import FinishReason
from walkserve.core.request import RequestSpec
from walkserve.engines.base import LATER, Engine, Firing, Group, Result
from walkserve.engines.stateless import component_batch
from walkserve.engines.values import concat, to_array, to_tensor
from walkserve.graph.walk import WalkGraph
from walkserve.placement.plan import Placement, RankSpec
from walkserve.protocol import messages as m
from walkserve.protocol.arrays import plain_value
from walkserve.testing.reference import ClientOutput, ReferenceResult
from walkserve.worker.executor import Executor
from walkserve.worker.outgoing import CONDUCTOR

RanksOf = Callable[[str, str], int]  # (walk, node) -> rank


@dataclass
class SimStats:
    messages: int = 0  # worker to worker
    start_walks: int = 0  # conductor to worker
    walks_started_by_workers: int = 0


class GroupOnlyEngine(Engine):
    """An engine that answers each group whole, one ``run_group`` per group.

    For the simulator and for tests of cohorts: subclasses implement ``run_group``.
    """

    def run_group(self, group: Group) -> list[Result]:
        raise NotImplementedError

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list[list[Result]]:
        return [self.run_group(g) for g in groups]

    def release(self, request_id: str) -> None:
        pass


def _forward(module: Any, firing: Firing) -> dict | str:
    try:
        return module.forward_batch(component_batch([firing]))[0]
    except Exception as e:
        return f"node {firing.node!r} failed: {type(e).__name__}: {e}"


def _firing(group: Group, i: int) -> Firing:
    spans = group.spans[i] if group.spans else {}
    return Firing(0, group.request_ids[i], group.walk, group.node, group.component, group.op, group.paths[i],
                  group.inputs[i], group.outputs, group.params[i], None, group.node_params, spans)


class _GroupEngine(GroupOnlyEngine):
    """Each member of a group through the component's ``forward_batch`` alone."""

    def __init__(self, component: str, module: Any):
        self.component, self.module = component, module

    def run_group(self, group: Group) -> list:
        return [_forward(self.module, _firing(group, i)) for i in range(len(group.request_ids))]


class _YieldingEngine(Engine):
    """Answers a random non-empty few of a group's members per call, the others ``LATER`` (when it may yield):
    a member's work starts at its first offer and is answered at a later one."""

    def __init__(self, component: str, module: Any, rng: random.Random):
        self.component, self.module, self.rng = component, module, rng
        self.inflight: dict[tuple, Firing] = {}  # (request, node, path) -> the member's work, as first offered

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list[list[Result]]:
        out = []
        for group in groups:
            keys = [(rid, group.node, path) for rid, path in zip(group.request_ids, group.paths, strict=True)]
            for i, key in enumerate(keys):
                self.inflight.setdefault(key, _firing(group, i))
            n = self.rng.randint(1, len(keys)) if may_yield else len(keys)
            answer = set(self.rng.sample(range(len(keys)), n))
            out.append([_forward(self.module, self.inflight.pop(key)) if i in answer else LATER
                        for i, key in enumerate(keys)])
        return out

    def release(self, request_id: str) -> None:
        self.inflight = {k: f for k, f in self.inflight.items() if k[0] != request_id}


def placement_of(graph: WalkGraph, ranks_of: RanksOf) -> Placement:
    """The placement ``ranks_of`` describes: every node of every walk on one rank."""
    entries = {(w, n): (ranks_of(w, n),) for w, plan in graph.plans.items() for n in plan.nodes}
    ranks = {r: RankSpec(r, "cpu") for candidates in entries.values() for r in candidates}
    return Placement("simulated", ranks, entries)


class Simulator:
    """Run requests through a virtual cluster; ``ranks_of(walk, node) -> rank`` places nodes."""

    def __init__(
        self,
        graph: WalkGraph,
        components: Mapping[str, Any],
        ranks_of: RanksOf,
        seed: int = 0,
        batched: bool = True,
        groups: float = 0.5,
        local_walks: bool = True,
        split_steps: int = 0,
    ):
        """``groups``: the share of (rank, component) engines that answer groups whole; the rest a few members
        per call."""
        self.graph, self.components, self.ranks_of = graph, components, ranks_of
        self.rng = random.Random(seed)
        self.batched, self.groups, self.local_walks = batched, groups, local_walks
        self.split_steps = split_steps
        self.placement = placement_of(graph, ranks_of)
        self.executors: dict[int, Executor] = {}
        self.channels: dict[tuple, deque] = defaultdict(deque)  # (src, dst) -> messages in order
        self.runs: dict[str, RequestRun] = {}
        self.results: dict[str, ReferenceResult] = {}
        self.arrivals: deque[RequestSpec] = deque()  # requests submitted while the others run (``arrive``)
        self.stats = SimStats()

    def firings(self) -> int:
        """Node instances run, over every rank."""
        return sum(ex.counters["firings"] for ex in self.executors.values())

    def executor(self, rank: int) -> Executor:
        ex = self.executors.get(rank)
        if ex is None:
            engines = {}
            for name, module in self.components.items():
                grouped = self.rng.random() < self.groups
                engines[name] = _GroupEngine(name, module) if grouped else _YieldingEngine(name, module, self.rng)
            ex = self.executors[rank] = Executor(
                rank, self.graph, engines, concat, self.placement, self.batched, (to_array, to_tensor),
                split_steps=self.split_steps,
            )
        return ex

    # ---- driving ---------------------------------------------------------------------------
    def submit(self, spec: RequestSpec) -> None:
        run = RequestRun(spec, self.graph, lambda plan, node, sticky: self.ranks_of(plan.name, node), self.local_walks)
        self.runs[spec.id] = run
        self.results[spec.id] = ReferenceResult()
        self._start_walk(run, *safe_advance(run, run.begin))

    def arrive(self, spec: RequestSpec) -> None:
        """``spec`` is submitted during ``run``, at a random step, after the requests ``arrive`` was given before it:
        it joins loops whose members are anywhere in their iterations."""
        self.arrivals.append(spec)

    def run(self, max_steps: int = 2_000_000) -> dict[str, ReferenceResult]:
        for _ in range(max_steps):
            live = [k for k, q in self.channels.items() if q]
            busy = [r for r, ex in self.executors.items() if ex.dirty]
            if self.arrivals and ((not live and not busy) or self.rng.random() < 0.02):
                self.submit(self.arrivals.popleft())
                continue
            if not live and not busy:
                break
            if busy and (not live or self.rng.random() < 0.4):
                self._tick(self.rng.choice(busy))
            else:
                key = self.rng.choice(live)
                self._deliver(key, self.channels[key].popleft())
        unfinished = [r for r in self.runs.values() if r.finished is None and r.error is None]
        if unfinished:
            raise RuntimeError(f"simulation stalled with {len(unfinished)} unfinished request(s): {[r.id for r in unfinished]}")
        return self.results

    def _tick(self, rank: int) -> None:
        """A pass over the rank's cohorts."""
        self.executors[rank].advance()
        self._flush(rank)

    def _flush(self, rank: int) -> None:
        for dest, msg in self.executors[rank].out.take():
            if dest != CONDUCTOR:
                self.stats.messages += 1
            self.channels[(("rank", rank), dest)].append(msg)

    def _deliver(self, key: tuple, msg: Any) -> None:
        dest = key[1]
        if dest == CONDUCTOR:
            self._conductor(msg)
            return
        rank = dest[1]
        if isinstance(msg, m.StartWalk):
            msg = msgspec.structs.replace(msg, inputs={k: to_tensor(plain_value(v)) for k, v in msg.inputs.items()})
        self.executor(rank).receive(msg)
        self._flush(rank)

    # ---- the conductor's side ----------------------------------------------------------------
    def _conductor(self, msg: Any) -> None:
        if isinstance(msg, m.ClientOuts):
            for rid, path, value in zip(msg.request_ids, msg.paths, msg.values, strict=True):
                r = self.runs[rid]
                if r.finished is None and r.error is None:
                    self.results[rid].outputs.append(ClientOutput(msg.modality, msg.walk, msg.node, tuple(path), value))
            return
        if isinstance(msg, m.WorkerStats):
            return
        run = self.runs[msg.request_id]
        if run.finished is not None or run.error is not None:
            return
        if isinstance(msg, m.Failed):
            self._fail(run, msg.error)
            return
        if isinstance(msg, m.WalkStarted):
            if run.walk_started(msg.finished, msg.firings, msg.walk, msg.ranks):
                self.stats.walks_started_by_workers += 1
                self._walk_complete(run, msg.finished, {})
            return
        if isinstance(msg, m.WalkOut):
            complete = run.walk_output(msg.walk, msg.name, to_array(msg.value))
        else:
            complete = run.node_done(msg.walk, msg.nodes, msg.firings, msg.hit_bound)
        if complete:
            self._walk_complete(run, run.walk, dict(run.outputs))
            self._start_walk(run, *safe_advance(run, run.advance))

    def _walk_complete(self, run: RequestRun, walk: str, outputs: dict) -> None:
        result = self.results[run.id]
        result.walks.append(walk)
        result.walk_outputs.append(outputs)

    def _start_walk(self, run: RequestRun, messages: list, error: str | None) -> None:
        result = self.results[run.id]
        if error:
            self._fail(run, error)
            return
        if run.finished is not None:
            result.finish = run.finished
            self._release(run)
            return
        for rank, msg in messages:
            self.stats.start_walks += isinstance(msg, m.StartWalk)
            self.channels[(CONDUCTOR, ("rank", rank))].append(msg)

    def _fail(self, run: RequestRun, error: str) -> None:
        run.error = error
        self.results[run.id].finish = FinishReason.ERROR
        self.results[run.id].error = error
        self._release(run)

    def _release(self, run: RequestRun) -> None:
        for rank in run.involved_ranks():
            self.channels[(CONDUCTOR, ("rank", rank))].append(m.Release(run.id))
