"""The executor: every request's walks on one rank, stepped as cohorts.

The worker's heartbeat (``worker.Worker.run``) drives it: receive -> advance -> send.

    receive   decoded messages: walks to start (StartWalk), rows of other ranks'
              batched messages, releases, stats queries
    advance   one pass of every cohort that may move (``cohort.Cohorts``), each engine
              called with groups (``Engine.run_groups``); then the walks that ended in
              it are reported, or their next walk starts here
    send      what the passes produced waits in ``out`` (``outgoing``) for the worker to send

Calls go down only. What a pass may do to the rank goes through ``effects``;
the rank's engines are ``engine_set``; the cohorts and the members that join
them are ``cohort.Cohorts``. Nothing below names the executor. Everything a
request does here hangs off its ``RequestState`` (``state``). It is
single-threaded: the worker's one thread runs it and its engines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from walkserve.core.scheduling import StreamScheduling
from walkserve.engines.base import Engine
from walkserve.graph.plan import INPUT
from walkserve.graph.walk import WalkGraph
from walkserve.placement.plan import Placement
from walkserve.protocol import messages as m
from walkserve.worker import iteration
from walkserve.worker.cohort import Cohorts
from walkserve.worker.deadlines import Deadlines
from walkserve.worker.effects import Effects
from walkserve.worker.engine_set import EngineSet
from walkserve.worker.local import local_level
from walkserve.worker.program import ROOT, compile_program
from walkserve.worker.row_targets import RowTargets
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
        scheduling: StreamScheduling | None = None,
        clock: Callable[[], float] = time.perf_counter,
        split_steps: int = 0,
    ):
        """``concat`` joins stream items and accumulated exits; ``convert`` = (to_array, to_tensor) for the
        state machine's values when this rank starts next walks itself (needs ``placement``). ``scheduling``
        orders a step's members (``deadlines``) on ``clock`` (a test's virtual clock). ``split_steps``: a step
        handing outputs to another rank goes in two halves from this many members on (0: never; ``cohort``)."""
        self.rank, self.graph, self.placement, self.convert = rank, graph, placement, convert
        self.fx = Effects(rank, concat)
        self.engine_set = EngineSet(engines, clock)
        self.scheduling = scheduling or StreamScheduling()
        self.deadlines = Deadlines(self.scheduling, self.engine_set.costs, clock)
        self.cohorts = Cohorts(self.fx, self.engine_set, self.deadlines, batched, split_steps)
        self.engines, self.out, self.counters = self.engine_set.engines, self.fx.out, self.fx.counters
        self.programs = {w: compile_program(p) for w, p in graph.plans.items()}
        self.requests: dict[str, RequestState] = {}
        self.early: dict[tuple[str, str], list[tuple[float, Row]]] = {}  # rows for walks not started here yet
        self.released: dict[str, float] = {}
        self.arrived: dict[str, set[int]] = {}  # request -> ranks whose contexts came, for a walk still held
        self.held: dict[str, list[m.StartWalk]] = {}  # walks waiting for that state
        self.row_targets = RowTargets()  # the members a peer's last message of each kind reached
        self.busy_s, self.steps, self.items = self.engine_set.busy_s, self.engine_set.steps, self.engine_set.items

    @property
    def dirty(self) -> dict:
        """The cohorts that may move: the next ``advance`` has work."""
        return self.fx.dirty


    # ---- messages ------------------------------------------------------------------------------
    def receive(self, msg: Any) -> None:
        self._handlers[type(msg)](self, msg)
        if self.fx.done:
            self._walks_done()

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
            req = self.requests[rid] = RequestState(rid, msg.params, msg.sampling, msg.node_sampling, msg.stream)
        if msg.spec is not None:
            req.may_pick(msg.spec, msg.sticky)
        self.start(req, msg.walk, msg.ranks, msg.inputs)

    def on_values(self, msg: m.Values) -> None:
        """The rows of a step, usually all for members of one cohort: put in one loop into the members earlier rows
        of the same requests reached (``row_targets``); the others looked up one by one."""
        self._apply_rows((msg.walk, msg.node, msg.output), msg.request_ids,
                         lambda members: Member.put_rows(members, msg.paths, msg.node, msg.output, msg.values),
                         lambda left, members: self._values_one_by_one(msg, left, members))

    def _apply_rows(self, key: tuple, rids: list[str], in_one_loop, one_by_one) -> None:
        """A message's rows: ``in_one_loop(members)`` applies those whose members earlier rows of the same requests
        reached (``row_targets``) and returns (rows left, cohorts touched); ``one_by_one(left, members)`` the rest,
        whose members are then kept for the next message."""
        members = self.row_targets.members(key, rids)
        left, cohorts = in_one_loop(members)
        for cohort in cohorts:
            self.fx.touch(cohort)
        if left:
            one_by_one(left, members)
            self.row_targets.keep(key, rids, members, left)

    def _values_one_by_one(self, msg: m.Values, rows: list[int], members: list[Member | None]) -> None:
        """Rows ``rows`` of ``msg``, each to its member found by request, walk and path (the cohort touched once per
        run of rows); ``members[i]`` becomes the member row i reached at an iteration (None: it waits, or had none)."""
        walk, node, out = msg.walk, msg.node, msg.output
        program, requests, levels, touched = self.programs[walk], self.requests, {}, None
        rids, paths, values = msg.request_ids, msg.paths, msg.values
        for i in rows:
            rid, path, value = rids[i], paths[i], values[i]
            members[i] = None
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
                run.stash((lid, outer), ValueRow(node, out, path, value))
                continue
            member.put(k, node, out, value)
            if depth:
                members[i] = member
            if member.cohort is not touched:
                touched = member.cohort
                self.fx.touch(touched)

    def on_items(self, msg: m.StreamItems) -> None:
        for rid, prefix, index, value in zip(msg.request_ids, msg.prefixes, msg.indices, msg.values, strict=True):
            self._row(rid, msg.walk, ItemRow(msg.stream, tuple(prefix), index, value))

    def on_ends(self, msg: m.StreamEnds) -> None:
        for rid, prefix, n in zip(msg.request_ids, msg.prefixes, msg.counts, strict=True):
            self._row(rid, msg.walk, EndRow(msg.stream, tuple(prefix), n))

    def on_loops(self, msg: m.LoopEvents) -> None:
        """A level's decisions: "continues" applied in one loop to the members earlier rows of the same requests
        reached (``row_targets``); ends, and rows for members not known yet, one by one."""
        self._apply_rows(("loops", msg.walk, msg.scope), msg.request_ids,
                         lambda members: Member.continue_rows(members, msg.outers, msg.ks, msg.ends),
                         lambda left, members: self._loops_one_by_one(msg, left, members))

    def _loops_one_by_one(self, msg: m.LoopEvents, rows: list[int], members: list[Member | None]) -> None:
        walk, scope, requests, touched = msg.walk, msg.scope, self.requests, None
        rids, outers, ks, ends = msg.request_ids, msg.outers, msg.ks, msg.ends
        for i in rows:
            rid, outer, k, end = rids[i], outers[i], ks[i], ends[i]
            req = requests.get(rid)
            run = req.walks.get(walk) if req is not None else None
            member = run.members.get((scope, outer)) if run is not None and not run.done and not req.failed else None
            members[i] = member
            if member is None:
                self._row(rid, walk, DecisionRow(scope, outer, k, end))
            elif end < 0:  # the common case, inline: iteration k continues
                member.continue_to(k)
                if member.cohort is not touched:
                    touched = member.cohort
                    self.fx.touch(touched)
            else:
                iteration.decision(self.fx, member, k, end)

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
        self.fx.count("contexts_moved_out", len(states))
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
        self.fx.count("contexts_moved_in", len(msg.contexts))
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
            self.cohorts.apply(run, row)

    # ---- walks and members ---------------------------------------------------------------------
    def start(self, req: RequestState, walk: str, ranks: Mapping[str, int], inputs: Mapping[str, Any]) -> WalkRun:
        program = self.programs[walk]
        run = req.start(program, ranks, self.rank)
        if req.spec is not None and run.all_local and self.placement is not None:
            # the conductor holds the walk outputs itself for the walks it starts, not for ours
            run.keep_here({output: inputs[name] for name, output in program.handed_on})
        local = local_level(program, ROOT, run.local_sets[ROOT])
        root = Member(run, local, (), None, {(INPUT, name): v for name, v in inputs.items()}, None)
        run.add(root)
        self.cohorts.add(local, root)
        for _, row in self.early.pop((req.id, walk), ()):
            if root.run.request.failed:
                break
            self.cohorts.apply(run, row)
        return run

    def _walks_done(self) -> None:
        done = self.fx.done
        while done:
            self._walk_done(done.pop(0))

    def _walk_done(self, run: WalkRun) -> None:
        """Every local node of the walk finished: report it, or start the next walk here."""
        req = run.request
        if req.failed:
            return
        if run.keep:
            start = next_walk_here(self.graph, self.placement, self.convert, self.rank, run)
            if start is not None:
                walk, ranks, inputs = start
                self.out.conductor(m.WalkStarted(req.id, run.walk, run.firings, run.hit_bound, walk, ranks))
                self.fx.count("walks_started_here")
                self.start(req, walk, ranks, inputs)
                return
            for name, value in run.outputs.items():
                self.out.conductor(m.WalkOut(req.id, run.walk, name, value))
        self.out.conductor(m.NodeDone(req.id, run.walk, sorted(run.local), run.firings, run.hit_bound))

    # ---- releases ------------------------------------------------------------------------------
    def release(self, rid: str) -> None:
        self.released[rid] = time.monotonic()
        self.row_targets.forget(rid)
        req = self.requests.pop(rid, None)
        if req is not None:
            for member in req.stop():
                self.fx.touch(member.cohort)
        for key in [k for k in self.early if k[0] == rid]:
            del self.early[key]
        self.arrived.pop(rid, None)
        self.held.pop(rid, None)
        self.cohorts.drop(rid)
        self.deadlines.forget(rid)
        self.engine_set.release(rid)

    def sweep(self) -> None:
        """Forget rows that waited too long for their walk, and old releases."""
        now = time.monotonic()
        for key in [k for k, rows in self.early.items() if rows and now - rows[0][0] > EARLY_TTL_S]:
            del self.early[key]
        for rid in [r for r, t in self.released.items() if now - t > 2 * EARLY_TTL_S]:
            del self.released[rid]

    # ---- the heartbeat's work ------------------------------------------------------------------
    def advance(self) -> bool:
        """One pass of every cohort that may move, then the walks that ended in it; True if any moved."""
        moved = self.cohorts.advance()
        if self.fx.done:
            self._walks_done()
        return moved

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
            per_node = engine.node_stats()
            if per_node:
                nodes.update({node: dict(s) for node, s in per_node.items()})
            elif self.steps.get(name):
                nodes[name] = {"batches": self.steps[name], "items": self.items[name], "busy_s": self.busy_s[name]}
        runs = [run for req in self.requests.values() for run in req.walks.values()]
        return m.RankStats(
            walk_states=sum(not run.done for run in runs),
            requests=len(self.requests),
            engine_state=state,
            inflight=self.cohorts.yielded(),
            cohort_members=self.cohorts.members(),
            early=sum(len(v) for v in self.early.values()) + sum(len(v) for run in runs for v in run.early.values())
            + sum(len(v) for v in self.held.values()),
            counters=dict(self.counters),
            engines=engines,
            nodes=nodes,
            busy_s=dict(self.busy_s),
            steps=dict(self.steps),
            **self._stream_stats(),
        )

    def _stream_stats(self) -> dict:
        """The deadline scheduler's view for admission and /metrics (``RankStats`` documents the fields)."""
        d = self.deadlines
        return {"stream_scheduling": self.scheduling.mode, "streams": d.streams(),
                "step_costs": self.engine_set.costs.snapshot(),
                "step_counts": self.engine_set.costs.count_snapshot(), "slack": {n: list(c) for n, c in d.slack_counts.items()},
                "scheduling": dict(d.counts), "gap_s": d.gap_s}

