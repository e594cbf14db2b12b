"""The executor: every request's walks on one rank, stepped as cohorts.

The worker's heartbeat (``worker.Worker.run``) drives it: receive -> advance -> step -> send.

    receive   decoded messages: walks to start (StartWalk), rows of other ranks'
              batched messages, releases, stats queries
    advance   one pass of every cohort that may move (``cohort``)
    step      one step of one engine with queued firings (engines without run_group)
    send      what the passes produced waits in ``out`` (``outgoing``) for the worker to send

Everything a request does here hangs off its ``RequestState`` (``state``). It
is single-threaded: the worker's one thread runs it and its engines.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from walkserve.engines.base import Engine
from walkserve.graph.plan import INPUT
from walkserve.graph.stop import resolve_count
from walkserve.graph.walk import WalkGraph
from walkserve.placement.plan import Placement
from walkserve.protocol import messages as m
from walkserve.worker import iteration, streams
from walkserve.worker.cohort import Cohort
from walkserve.worker.local import ChildUnit, LocalLevel, NodeUnit, local_level
from walkserve.worker.outgoing import Outgoing
from walkserve.worker.program import ROOT, ExitRoute, compile_program
from walkserve.worker.rows import DecisionRow, EndRow, FlowRow, ItemRow, Row, ValueRow
from walkserve.worker.state import Member, RequestState, WalkRun
from walkserve.worker.transition import next_walk_here

log = logging.getLogger(__name__)

EARLY_TTL_S = 30.0


class Executor:
    def __init__(
        self,
        rank: int,
        graph: WalkGraph,
        engines: Mapping[str, Engine],
        concat: Callable[[list, Any], Any],
        placement: Placement | None = None,
        batched: bool = True,
        convert: tuple[Callable, Callable] | None = None,
    ):
        """``concat`` joins stream items and accumulated exits; ``convert`` = (to_array, to_tensor) for the
        state machine's values when this rank starts next walks itself (needs ``placement``)."""
        self.rank, self.graph, self.engines = rank, graph, dict(engines)
        self.concat, self.placement, self.batched, self.convert = concat, placement, batched, convert
        self.programs = {w: compile_program(p) for w, p in graph.plans.items()}
        self.requests: dict[str, RequestState] = {}
        self.cohorts: dict[Any, Cohort] = {}
        self.dirty: dict[Cohort, None] = {}
        self.pending: dict[int, tuple[Cohort, Member, NodeUnit, int]] = {}  # firing id -> who waits for it
        self.early: dict[tuple[str, str], list[tuple[float, Row]]] = {}  # rows for walks not started here yet
        self.released: dict[str, float] = {}
        self.arrived: dict[str, set[int]] = {}  # request -> ranks whose contexts came, for a walk still held
        self.held: dict[str, list[m.StartWalk]] = {}  # walks waiting for that state
        self.out = Outgoing()
        self.counters: dict[str, int] = defaultdict(int)
        self.busy_s: dict[str, float] = defaultdict(float)
        self.steps: dict[str, int] = defaultdict(int)
        self.items: dict[str, int] = defaultdict(int)
        self._ids = itertools.count()
        distinct = {id(e): name for name, e in self.engines.items()}  # a KV share group's engine serves several names
        self._order, self._next = list(distinct.values()), 0

    # ---- messages ------------------------------------------------------------------------------
    def receive(self, msg: Any) -> None:
        self._handlers[type(msg)](self, msg)

    def on_start(self, msg: m.StartWalk) -> None:
        rid = msg.request_id
        if rid in self.released:
            return
        if msg.moved_in:
            arrived = self.arrived.get(rid, set())
            if not set(msg.moved_in) <= arrived:
                self.held.setdefault(rid, []).append(msg)  # its contexts are still on their way here
                return
            arrived.difference_update(msg.moved_in)
        req = self.requests.get(rid)
        if req is None:
            req = self.requests[rid] = RequestState(rid, msg.params, msg.sampling, msg.node_sampling)
        if msg.spec is not None:
            req.spec, req.sticky = msg.spec, dict(msg.sticky)
        self.start(req, msg.walk, msg.ranks, msg.inputs)

    def on_values(self, msg: m.Values) -> None:
        walk, node, out = msg.walk, msg.node, msg.output
        program, requests, levels = self.programs[walk], self.requests, {}
        for rid, path, value in zip(msg.request_ids, msg.paths, msg.values, strict=True):
            req = requests.get(rid)
            run = req.walks.get(walk) if req is not None else None
            if run is None or run.done or req.failed:
                self._row(rid, walk, ValueRow(node, out, path, value))
                continue
            depth = len(path)
            lid = levels.get(depth)
            if lid is None:
                lid = levels[depth] = program.landing(node, depth).id
            outer, k = (path[:-1], path[-1]) if depth else ((), 0)
            member = run.members.get((lid, outer))
            if member is None:
                self.stash(run, (lid, outer), ValueRow(node, out, path, value))
            else:
                member.put(k, node, out, value)
                self.dirty[member.cohort] = None

    def on_items(self, msg: m.StreamItems) -> None:
        for rid, prefix, index, value in zip(msg.request_ids, msg.prefixes, msg.indices, msg.values, strict=True):
            self._row(rid, msg.walk, ItemRow(msg.stream, tuple(prefix), index, value))

    def on_ends(self, msg: m.StreamEnds) -> None:
        for rid, prefix, n in zip(msg.request_ids, msg.prefixes, msg.counts, strict=True):
            self._row(rid, msg.walk, EndRow(msg.stream, tuple(prefix), n))

    def on_loops(self, msg: m.LoopEvents) -> None:
        walk, scope, requests = msg.walk, msg.scope, self.requests
        for rid, outer, k, end in zip(msg.request_ids, msg.outers, msg.ks, msg.ends, strict=True):
            req = requests.get(rid)
            run = req.walks.get(walk) if req is not None else None
            member = run.members.get((scope, outer)) if run is not None and not run.done and not req.failed else None
            if member is None:
                self._row(rid, walk, DecisionRow(scope, outer, k, end))
            elif end < 0:  # the common case, inline: iteration k continues
                if k > member.decided:
                    member.decided = k
                self.dirty[member.cohort] = None
            else:
                iteration.decision(self, member, k, end)

    def on_flows(self, msg: m.Flows) -> None:
        for rid, prefix, pause in zip(msg.request_ids, msg.prefixes, msg.pauses, strict=True):
            self._row(rid, msg.walk, FlowRow(msg.stream, tuple(prefix), pause))

    def on_move(self, msg: m.MoveContexts) -> None:
        """The request's next walk uses these contexts elsewhere: they go there (Contexts)."""
        rid, states = msg.request_id, []
        if rid in self.released:
            return
        names: dict[int, tuple[Any, set[str]]] = {}  # one export per engine (a KV share group has one)
        for comp, contexts in msg.contexts.items():
            engine = self.engines.get(comp)
            if engine is not None:
                names.setdefault(id(engine), (engine, set()))[1].update(contexts)
        for engine, contexts in names.values():
            try:
                if not engine.migrates:
                    raise ValueError(f"engine {engine.component!r} cannot move a request's state")
                states += engine.export_contexts(rid, sorted(contexts))
            except ValueError as e:
                self.out.conductor(m.Failed(rid, f"the contexts {msg.contexts} could not move: {e}"))
                return
        self.counters["contexts_moved_out"] += len(states)
        self.out.to(msg.to_rank, m.Contexts(rid, self.rank, states))

    def on_contexts(self, msg: m.Contexts) -> None:
        """Contexts another rank's engines exported for a request: into this rank's engines, then its walk may start."""
        rid = msg.request_id
        if rid in self.released:
            return
        by_engine: dict[int, tuple[Any, list]] = {}
        for st in msg.contexts:
            engine = self.engines.get(st.component)
            if engine is not None:
                by_engine.setdefault(id(engine), (engine, []))[1].append(st)
        for engine, mine in by_engine.values():
            try:
                engine.import_contexts(rid, mine)
            except Exception as e:
                log.exception("engine %s failed to take the contexts of %s", engine.component, rid)
                self.out.conductor(m.Failed(rid, f"the contexts from rank {msg.from_rank} could not move here: {e}"))
                return
        self.counters["contexts_moved_in"] += len(msg.contexts)
        self.arrived.setdefault(rid, set()).add(msg.from_rank)
        for start in self.held.pop(rid, ()):
            self.on_start(start)

    def on_release(self, msg: m.Release) -> None:
        self.release(msg.request_id)

    def on_stats_query(self, msg: m.StatsQuery) -> None:
        self.out.conductor(m.WorkerStats(self.rank, self.stats()))

    _handlers = {
        m.StartWalk: on_start,
        m.Values: on_values,
        m.StreamItems: on_items,
        m.StreamEnds: on_ends,
        m.LoopEvents: on_loops,
        m.Flows: on_flows,
        m.MoveContexts: on_move,
        m.Contexts: on_contexts,
        m.Release: on_release,
        m.StatsQuery: on_stats_query,
    }
    handles = frozenset(_handlers)

    def _row(self, rid: str, walk: str, row: Row) -> None:
        req = self.requests.get(rid)
        run = req.walks.get(walk) if req is not None else None
        if run is None:
            if rid not in self.released:
                self.early.setdefault((rid, walk), []).append((time.monotonic(), row))
        elif not run.done and not req.failed:
            self.apply(run, row)

    def apply(self, run: WalkRun, row: Row) -> None:
        kind = type(row)
        if kind is ValueRow:
            level = run.program.landing(row.node, len(row.path))
            outer, k = (row.path[:-1], row.path[-1]) if level.depth else ((), 0)
            member = run.members.get((level.id, outer))
            if member is None:
                self.stash(run, (level.id, outer), row)
            else:
                member.put(k, row.node, row.output, row.value)
                self.touch(member.cohort)
        elif kind is ItemRow:
            streams.push(self, run, row.stream, row.prefix, row.index, row.value)
        elif kind is EndRow:
            streams.ended(self, run, row.stream, row.prefix, row.n_items)
        elif kind is DecisionRow:
            member = run.members.get((row.scope, row.outer))
            if member is None:
                self.stash(run, (row.scope, row.outer), row)
            else:
                iteration.decision(self, member, row.k, row.end)
        else:
            streams.paused(self, run, row.stream, row.prefix, row.pause)

    def stash(self, run: WalkRun, key: tuple, row: Row) -> None:
        """A row for a level instance that has not joined on this rank yet."""
        run.early.setdefault(key, []).append(row)

    # ---- walks and members ---------------------------------------------------------------------
    def start(self, req: RequestState, walk: str, ranks: Mapping[str, int], inputs: Mapping[str, Any]) -> WalkRun:
        program = self.programs[walk]
        run = req.walks[walk] = WalkRun(req, program, ranks, self.rank)
        run.keep = req.spec is not None and run.all_local and self.placement is not None
        local = local_level(program, ROOT, run.local_sets[ROOT])
        root = Member(run, local, (), None, {(INPUT, name): v for name, v in inputs.items()}, None)
        run.members[(ROOT, ())] = root
        if run.keep:  # the conductor holds these itself for the walks it starts, not for ours
            for name, output in program.handed_on:
                run.outputs[output] = inputs[name]
        self._cohort(local, run).add(root)
        for _, row in self.early.pop((req.id, walk), ()):
            if root.run.request.failed:
                break
            self.apply(run, row)
        return run

    def join(self, pm: Member, unit: ChildUnit) -> bool:
        """``pm`` starts its child instance for its current iteration; False if the request failed."""
        child, run = unit.child, pm.run
        level = child.level
        entry = {}
        for key in unit.entry_cur:
            value = pm.cur.get(key[0], {}).get(key[1], _MISSING)
            if value is _MISSING:
                self.fail(run, f"node {key[0]!r} returned no output {key[1]!r}, which loop {level.id!r} reads")
                return False
            entry[key] = value
        for key in unit.entry_up:
            entry[key] = pm.entry[key]
        bound = None
        if level.loop_like:
            try:
                bound = resolve_count(level.bound, run.request.params, f"loop {level.id!r}")
            except ValueError as e:
                self.fail(run, str(e))
                return False
        path = pm.path
        member = Member(run, child, path, pm, entry, bound)
        run.members[(level.id, path)] = member
        pm.children += 1
        self._cohort(child, run).add(member)
        for row in run.early.pop((level.id, path), ()):
            self.apply(run, row)
        return True

    def _cohort(self, local: LocalLevel, run: WalkRun) -> Cohort:
        key = local if self.batched else (local, run.request.id)
        cohort = self.cohorts.get(key)
        if cohort is None:
            cohort = self.cohorts[key] = Cohort(self, local)
        return cohort

    def land(self, pm: Member, route: ExitRoute, value: Any) -> None:
        """An exit value arrives in the level it lands in (``pm``'s), here and on the ranks that read it."""
        run = pm.run
        if route.walk_output is not None:
            self.walk_output(run, route.walk_output, value)
        if route.readers:
            if not run.local.isdisjoint(route.readers):
                pm.put(pm.k, route.node, route.output, value)
                self.touch(pm.cohort)
            for rank in run.remote_readers((route.node, route.output, route.levels), route.readers):
                self.out.value(rank, run.walk, route.node, route.output, run.request.id, pm.path, value)

    def walk_output(self, run: WalkRun, name: str, value: Any) -> None:
        if run.keep:
            run.outputs[name] = value
        else:
            self.out.conductor(m.WalkOut(run.request.id, run.walk, name, value))

    def walk_done(self, run: WalkRun) -> None:
        """Every local node of the walk finished: report it, or start the next walk here."""
        run.done = True
        run.early.clear()
        req = run.request
        if req.failed:
            return
        if run.keep:
            start = next_walk_here(self, run)
            if start is not None:
                walk, ranks, inputs = start
                self.out.conductor(m.WalkStarted(req.id, run.walk, run.firings, run.hit_bound, walk, ranks))
                self.counters["walks_started_here"] += 1
                self.start(req, walk, ranks, inputs)
                return
            for name, value in run.outputs.items():
                self.out.conductor(m.WalkOut(req.id, run.walk, name, value))
        self.out.conductor(m.NodeDone(req.id, run.walk, sorted(run.local), run.firings, run.hit_bound))

    def touch(self, cohort: Cohort) -> None:
        self.dirty[cohort] = None

    # ---- failures and releases -----------------------------------------------------------------
    def fail(self, run: WalkRun, error: str) -> None:
        """The request cannot go on: report it once; its members stop (the conductor releases it)."""
        req = run.request
        if req.failed:
            return
        req.failed = True
        self.out.conductor(m.Failed(req.id, error))
        for r in req.walks.values():
            for member in r.members.values():
                member.live = False
            r.members.clear()

    def release(self, rid: str) -> None:
        self.released[rid] = time.monotonic()
        req = self.requests.pop(rid, None)
        if req is not None:
            for run in req.walks.values():
                for member in run.members.values():
                    member.live = False
                    self.touch(member.cohort)
        self.pending = {f: rec for f, rec in self.pending.items() if rec[1].run.request.id != rid}
        for key in [k for k in self.early if k[0] == rid]:
            del self.early[key]
        self.arrived.pop(rid, None)
        self.held.pop(rid, None)
        if not self.batched:
            for key in [k for k in self.cohorts if k[1] == rid]:
                self.dirty.pop(self.cohorts.pop(key), None)
        for engine in self.engines.values():
            try:
                engine.release(rid)
            except Exception:
                log.exception("engine %s failed to release %s", engine.component, rid)

    def sweep(self) -> None:
        """Forget rows that waited too long for their walk, and old releases."""
        now = time.monotonic()
        for key in [k for k, rows in self.early.items() if rows and now - rows[0][0] > EARLY_TTL_S]:
            del self.early[key]
        for rid in [r for r, t in self.released.items() if now - t > 2 * EARLY_TTL_S]:
            del self.released[rid]

    # ---- the heartbeat's work ------------------------------------------------------------------
    def advance(self) -> bool:
        """One pass of every cohort that may move; True if any did.

        A cohort whose pass only ended iterations (its members waited at the end for another
        rank) passes once more, after the others: its next iteration starts in this heartbeat,
        together with the members the others' passes made join it.
        """
        if not self.dirty:
            return False
        dirty, self.dirty = self.dirty, {}
        moved, again = False, []
        for cohort in dirty:
            if cohort.advance():
                moved = True
                self.dirty[cohort] = None
                if cohort.again:
                    again.append(cohort)
        for cohort in again:
            if cohort.advance():
                self.dirty[cohort] = None
        return moved

    def next_id(self) -> int:
        return next(self._ids)

    def step_engine(self) -> bool:
        """One step of the next engine (round robin) with queued firings; False if none has any."""
        name = self._pick()
        if name is None:
            return False
        engine = self.engines[name]
        t0 = time.perf_counter()
        try:
            results = engine.step()
        except Exception as e:
            log.exception("engine %s failed a step", name)
            self._engine_failed(name, f"engine {name!r} failed: {type(e).__name__}: {e}")
            return True
        self.busy_s[name] += time.perf_counter() - t0
        self.steps[name] += 1
        self.items[name] += len(results)
        pending = self.pending
        for r in results:
            rec = pending.pop(r.firing.id, None)
            if rec is not None:
                cohort, member, unit, k = rec
                cohort.on_result(member, unit, k, r.outputs, r.error)
        return True

    def _pick(self) -> str | None:
        order = self._order
        for i in range(len(order)):
            name = order[(self._next + i) % len(order)]
            if self.engines[name].has_work():
                self._next = (self._next + i + 1) % len(order)
                return name
        return None

    def _engine_failed(self, name: str, error: str) -> None:
        """An engine raised in a step: every request waiting on it fails, and the engine drops its firings."""
        failed, engine = set(), self.engines[name]
        for fid, (_, member, unit, _) in list(self.pending.items()):
            if self.engines[unit.node.component] is engine:
                del self.pending[fid]
                failed.add(member.run.request.id)
                if member.live:
                    self.fail(member.run, error)
        for rid in failed:
            try:
                self.engines[name].release(rid)
            except Exception:
                log.exception("engine %s failed to release %s", name, rid)

    # ---- stats ---------------------------------------------------------------------------------
    def stats(self) -> m.RankStats:
        engines, nodes, state, counted = {}, {}, 0, set()
        for name, engine in self.engines.items():
            try:
                engines[name] = dict(engine.stats())
                if id(engine) not in counted:  # a KV share group's one engine: its requests once
                    state += engine.state_count()
                    counted.add(id(engine))
            except Exception:
                engines[name] = {}
            per_node = getattr(engine, "node_stats", None)
            if per_node:
                nodes.update({node: dict(s) for node, s in per_node.items()})
            elif self.steps.get(name):
                nodes[name] = {"batches": self.steps[name], "items": self.items[name], "busy_s": self.busy_s[name]}
        runs = [run for req in self.requests.values() for run in req.walks.values()]
        return m.RankStats(
            walk_states=sum(not run.done for run in runs),
            requests=len(self.requests),
            engine_state=state,
            inflight=len(self.pending),
            cohort_members=sum(c.members() for c in self.cohorts.values()),
            early=sum(len(v) for v in self.early.values()) + sum(len(v) for run in runs for v in run.early.values())
            + sum(len(v) for v in self.held.values()),
            counters=dict(self.counters),
            engines=engines,
            nodes=nodes,
            busy_s=dict(self.busy_s),
            steps=dict(self.steps),
        )


_MISSING = object()
