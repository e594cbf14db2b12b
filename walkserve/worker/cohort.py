"""A cohort: every member of one local level, stepped together (one engine call per node per step).

The big idea: a member is one instance of a level (a loop instance, a stream
scope's instance, a walk's top) and sits at a *unit* of its iteration. A pass
walks the units in order; at each unit, every member that is there and has
what the unit needs runs it at once:

    node unit    one Group for all of them (Engine.run_groups); a member the engine
                 answers LATER stays and is offered again next pass; a gathering
                 engine's group waits for its one call after the pass
    child unit   each member starts its child instance (a nested loop, a stream
                 consumer's scope); the child runs in its own cohort, concurrently,
                 and the member's iteration ends only after the child ended
    end          the members whose units are done end their iteration together
                 (``iteration``: decision, exposure, exits, carries) and are back
                 at the first unit for the next one

    buckets[i]: members at unit i     pass: i = 0 .. n-1, then the end

A member moves through every unit whose inputs are here within one pass, so
members that started the pass together step in lockstep; a member that waits
(a value from another rank, a stream chunk, a child) stays in its bucket and
is looked at again on the next pass. A new member joins at the next step
boundary (when members start an iteration, or none is inside one), so it
steps with the others instead of half a step behind them. What a step sends
(client rows, values for other ranks, stream items) is appended per output
for all members at once.
"""

from __future__ import annotations

from typing import Any

from walkserve.engines.base import Engine
from walkserve.graph.stop import resolve_count
from walkserve.worker import iteration, streams
from walkserve.worker.deadlines import Deadlines
from walkserve.worker.effects import Effects
from walkserve.worker.engine_set import EngineSet
from walkserve.worker.gathered import Call, pick_gathered
from walkserve.worker.group import build_group
from walkserve.worker.local import ChildUnit, LocalLevel, NodeUnit
from walkserve.worker.program import CUR, LevelKind, NodeProgram
from walkserve.worker.rows import DecisionRow, EndRow, ItemRow, Row, ValueRow
from walkserve.worker.state import (
    ANSWERED,
    ENDED,
    GATED,
    RUNNING,
    WAITING,
    YIELDED,
    Member,
    WalkRun,
)
from walkserve.worker.waits import has_check

_MISSING = object()


class Cohort:
    __slots__ = ("again", "boundary", "buckets", "engines", "fx", "has", "joining", "later", "local", "ready",
                 "registry", "start_waits", "units")

    def __init__(self, registry: Cohorts, local: LocalLevel):
        self.registry, self.fx, self.engines = registry, registry.fx, registry.engines
        self.local, self.units = local, local.units
        self.buckets: list[list[Member]] = [[] for _ in range(len(local.units) + 1)]
        self.has = [has_check(unit) for unit in local.units]  # per unit: whether a member has what it waits for
        self.joining: list[Member] = []
        self.boundary = False  # members started an iteration in the last pass
        self.again = False  # the last pass only ended iterations: pass again now
        self.later = False  # the last pass left members an engine answered LATER: they are offered again
        self.ready = False  # the last pass started iterations that may run their first unit at once
        # a new iteration cannot start its first unit before a value of it comes from elsewhere (which touches us)
        first = local.units[0] if local.units else None
        self.start_waits = not local.gated and (
            bool(first.waits) if type(first) is ChildUnit else first is not None and any(r.kind is CUR for r in first.waits))

    def add(self, m: Member) -> None:
        m.joined(self)
        if self.local.level.kind is LevelKind.ROOT:
            self.buckets[0].append(m)
        else:
            self.joining.append(m)
        self.fx.touch(self)

    def members(self) -> int:
        return sum(1 for b in (*self.buckets, self.joining) for m in b if m.live)

    def size(self) -> int:
        """Members in the cohort's buckets (those that ended may still be counted until a pass drops them; those a
        pass took out of their bucket to run a unit are not)."""
        return sum(len(b) for b in self.buckets)

    def yielded(self) -> int:
        return sum(1 for b in self.buckets for m in b if m.phase is YIELDED)

    def _admits(self) -> bool:
        """New members may join now: members started an iteration in the last pass, or none is inside one."""
        return self.boundary or not any(m.live for b in self.buckets[1:] for m in b)

    def _admit(self) -> bool:
        if self._admits():
            self.buckets[0].extend(self.joining)
            self.joining = []
            return True
        return False

    # ---- one pass ------------------------------------------------------------------------------
    def advance(self) -> bool:
        """Run every unit its members are ready for, and end the iterations that are complete.
        ``again``: no unit ran but iterations ended (members waited on another rank), so the
        executor passes once more in this heartbeat and the next iteration starts at once."""
        moved, ran = bool(self.joining) and self._admit(), False
        self.boundary = self.later = self.ready = False
        buckets, fx = self.buckets, self.fx
        joined: list[Call] = []  # node units of one engine call, run when the call's last unit is reached
        for i, unit in enumerate(self.units):
            if joined and not self.units[i - 1].joins_next:
                self._run_joined(joined)
                joined = []
            bucket = buckets[i]
            if not bucket:
                continue
            ready, stay, nxt = [], [], buckets[i + 1]
            has = self.has[i]
            for m in bucket:
                phase = m.phase
                if phase is RUNNING or phase is YIELDED:
                    (stay if has is not None and not has(m) else ready).append(m)
                elif phase is GATED:  # at the first unit of a gated level
                    if not iteration.gate(fx, m):
                        if m.live:
                            stay.append(m)
                        continue
                    (stay if has is not None and not has(m) else ready).append(m)
                elif phase is ANSWERED:
                    m.move_to(i + 1)
                    nxt.append(m)
                    moved = True
                elif phase is WAITING:
                    stay.append(m)
                # ENDED: dropped
            buckets[i] = stay
            if ready:
                moved = ran = True
                if type(unit) is ChildUnit:
                    self._start_children(unit, ready, nxt, i)
                elif joined or unit.joins_next:
                    self._prepare(unit, ready, stay, nxt, i, joined)
                else:
                    self._run(unit, ready, stay, nxt, i)
        if joined:
            self._run_joined(joined)
        if buckets[-1]:
            moved |= self._finish()
        self.again = not ran and self.boundary
        return moved

    @property
    def unfinished(self) -> bool:
        """The last pass left work the next can do with no message: iterations started that may run their first unit,
        new members that may join (at its step boundary, or because those inside an iteration ended: a last
        iteration makes no boundary), members answered LATER. Any other member waits for what touches the cohort
        when it comes (a row, a decision, a chunk, a child's end, an engine's answer, a deferred pick)."""
        return self.ready or self.later or (bool(self.joining) and self._admits())

    # ---- node units ----------------------------------------------------------------------------
    def _run(self, unit: NodeUnit, ready: list[Member], stay: list[Member], nxt: list[Member], i: int) -> None:
        engine = self.engines[unit.node.component]
        ready = self.registry.pick(self, unit, engine, ready, stay)
        built = build_group(self.fx, unit, ready, engine.kv_contexts) if ready else None
        if built is None:
            return
        members, group = built
        if engine.gathers:  # called once after the pass, with every cohort's groups: the members wait for it
            for m in members:
                m.wait()
                stay.append(m)
            self.registry.gather(engine, Call(unit, members, group, self))
            return
        Member.move_all(self._store(unit, members, self.engines.call(engine, [group], may_yield=True)[0], stay),
                        i + 1, nxt)

    def _prepare(self, unit: NodeUnit, ready: list[Member], stay: list[Member], nxt: list[Member], i: int,
                 joined: list[Call]) -> None:
        """A unit of a joined engine call: its group waits for the call's last unit; the members go on to the
        next unit at once (it reads nothing of this one)."""
        engine = self.engines[unit.node.component]
        if engine.gathers:
            self._run(unit, ready, stay, nxt, i)
            return
        built = build_group(self.fx, unit, ready, engine.kv_contexts)
        if built is None:
            return
        joined.append(Call(unit, *built))
        Member.move_all(built[0], i + 1, nxt)

    def _run_joined(self, joined: list[Call]) -> None:
        """One engine call for the groups of consecutive joined units (``Engine.run_groups``)."""
        engine = self.engines[joined[0].unit.node.component]
        for call, results in zip(joined, self.engines.call(engine, [c.group for c in joined])):
            self._store(call.unit, call.members, results, None)

    def _store(self, unit: NodeUnit, members: list[Member], results: list, stay: list[Member] | None) -> list[Member]:
        """The members' results: outputs kept, errors fail their request, a member answered LATER waits in ``stay``
        for the next pass (offered again). Returns the members that ran."""
        fx, name = self.fx, unit.node.name
        done, later, failed = Member.take(members, name, results, stay is not None)
        fx.count("firings", len(members) - len(later))
        if later:  # their work goes on in the engine: answered when offered again
            self.engines.unanswered(unit.node.component, len(later))
            stay.extend(later)
            self.later = True
        for m, out in failed:
            fx.fail(m.run, out if isinstance(out, str) else f"node {name!r} returned {type(out).__name__}, not outputs")
        self.registry.deadlines.ran(unit.node, done)
        self._produced(unit, done)
        return done

    def answered(self, unit: NodeUnit, members: list[Member], results: list) -> None:
        """A gathering engine's call after the pass answered the members of ``unit``: they move on next pass."""
        for m in self._store(unit, members, results, None):
            if m.live:
                m.answered()
        self.fx.touch(self)

    def _produced(self, unit: NodeUnit, done: list[Member]) -> None:
        """A node ran for ``done``: consume stream chunks, send what other ranks read, let leaving outputs go."""
        fx = self.fx
        for stream in unit.chunks:
            for m in done:
                streams.consumed(fx, m.run, stream, m.outer, m.k)
        if unit.sends:
            self._send(unit, done)
        if unit.leaves:
            self.leave(unit.node, done)

    def _send(self, unit: NodeUnit, done: list[Member]) -> None:
        out, name = self.fx.out, unit.node.name
        walk = self.local.program.walk
        for output, readers in unit.sends:
            key = (name, output)
            values = [v for m in done if (v := m.cur[name].get(output, _MISSING)) is not _MISSING]
            ranks = done[0].run.remote_readers(key, readers) if done else ()
            if len(values) == len(done) and [m.run.targets.get(key) for m in done].count(ranks) == len(done):
                # the common case: every member's value goes to the same ranks (``remote_readers`` cached them alike)
                rids, paths = [m.rid for m in done], [m.path for m in done]
                for rank in ranks:
                    into = out.value_rows(rank, walk, name, output)
                    into[0].extend(rids)
                    into[1].extend(paths)
                    into[2].extend(values)
                continue
            rows, ranks, into = {}, None, ()
            for m in done:
                value = m.cur[name].get(output, _MISSING)
                if value is _MISSING:
                    continue
                mine = m.run.remote_readers(key, readers)
                if mine != ranks:  # the members of a step mostly read on the same ranks: their rows found once
                    ranks, into = mine, [rows.get(r) or rows.setdefault(r, out.value_rows(r, walk, name, output))
                                         for r in mine]
                for rids, paths, values in into:
                    rids.append(m.rid)
                    paths.append(m.path)
                    values.append(value)

    def leave(self, node: NodeProgram, members: list[Member]) -> None:
        """``node``'s outputs of this iteration that leave it: client rows, stream items, walk outputs."""
        fx, name = self.fx, node.name
        for output, modality in node.client:
            if self.local.level.hold_at is not None:
                for m in members:
                    value = m.cur[name].get(output, _MISSING)
                    if value is not _MISSING:
                        iteration.client(fx, m, name, output, modality, m.path, value)
                continue
            rids, paths, values = fx.out.client_rows(self.local.program.walk, name, output, modality)
            for m in members:
                value = m.cur[name].get(output, _MISSING)
                if value is not _MISSING:
                    rids.append(m.rid)
                    paths.append(m.path)
                    values.append(value)
        for output, stream in node.streams:
            for m in members:
                value = m.cur[name].get(output, _MISSING)
                if value is not _MISSING:
                    streams.item(fx, m.run, stream, m.outer, m.k, value)
        for output, walk_output in node.walk_outputs:
            for m in members:
                value = m.cur[name].get(output, _MISSING)
                if value is not _MISSING:
                    iteration.walk_output(fx, m.run, walk_output, value)

    # ---- ends of iterations --------------------------------------------------------------------
    def _finish(self) -> bool:
        """End the iterations of the members whose units are done (whose decision is known)."""
        fx, local = self.fx, self.local
        decided, stay = [], []
        told = local.awaits  # another rank decides: wait here until its decision came
        for m in self.buckets[-1]:
            if m.phase is ENDED:
                continue
            if m.children:
                stay.append(m)
                continue
            if told and m.end is None:  # another rank decides: iteration k goes on once its decision came
                if m.decided < m.k:
                    stay.append(m)
                else:
                    decided.append((m, None))
                continue
            end = iteration.decide(fx, m)
            if end is iteration.WAIT:
                stay.append(m)
            elif m.phase is not ENDED:
                decided.append((m, end))
        self.buckets[-1] = stay
        if not decided:
            return False
        if local.at_finish:
            exposed = [m for m, end in decided if end is None or m.k < end]
            for node in local.leaving:
                self.leave(node, exposed)
        if local.exits or any(m.held for m, _ in decided):
            for m, end in decided:
                if end is None or m.k < end:
                    iteration.expose(fx, m)
                else:
                    m.take_held()  # not exposed: what waited for it is dropped
        fx.hand_off_now()  # the step's values and decisions for other ranks go before the next iteration's set-up
        first, ready, waits = self.buckets[0], self.ready, self.start_waits
        n_first = len(first)
        for m, end in decided:
            if m.phase is ENDED:
                continue
            if end is not None and end <= m.k + 1:
                iteration.end_member(fx, m, end)
            else:
                m.next_iteration()
                first.append(m)
                if not ready and (not waits or m.cur):  # its first unit's values from elsewhere may be here (ahead)
                    ready = True
        self.ready = ready
        if len(first) > n_first:
            self.boundary = True
        return True

    # ---- child units ---------------------------------------------------------------------------
    def _start_children(self, unit: ChildUnit, ready: list[Member], nxt: list[Member], i: int) -> None:
        for m in ready:
            if self.registry.join(m, unit):
                m.move_to(i + 1)
                nxt.append(m)


class Cohorts:
    """The rank's cohorts: one per local level (per request too with loop cohorts off), the members that join
    them, the rows that reach a walk's members, and the passes."""

    def __init__(self, fx: Effects, engines: EngineSet, deadlines: Deadlines, batched: bool = True,
                 split_steps: int = 0):
        self.fx, self.engines, self.deadlines, self.batched = fx, engines, deadlines, batched
        self.split_steps = split_steps  # a hand-off step of at least this many members goes in two halves
        self.by_key: dict[Any, Cohort] = {}
        self.gathered: dict[Engine, list[Call]] = {}  # the gathering engines' calls, for after the pass

    def add(self, local: LocalLevel, member: Member) -> None:
        key = local if self.batched else (local, member.rid)
        cohort = self.by_key.get(key)
        if cohort is None:
            cohort = self.by_key[key] = Cohort(self, local)
        cohort.add(member)

    def join(self, pm: Member, unit: ChildUnit) -> bool:
        """``pm`` starts its child instance for its current iteration; False if the request failed."""
        child, run, entry = unit.child, pm.run, {}
        level = child.level
        for key in unit.entry_cur:
            value = pm.cur.get(key[0], {}).get(key[1], _MISSING)
            if value is _MISSING:
                self.fx.fail(run, f"node {key[0]!r} returned no output {key[1]!r}, which loop {level.id!r} reads")
                return False
            entry[key] = value
        for key in unit.entry_up:
            entry[key] = pm.entry[key]
        bound = None
        if level.loop_like:
            try:
                bound = resolve_count(level.bound, run.request.request_params, f"loop {level.id!r}")
            except ValueError as e:
                self.fx.fail(run, str(e))
                return False
        member = Member(run, child, pm.path, pm, entry, bound)
        run.add(member)
        pm.child_started()
        self.add(child, member)
        for row in run.take_early((level.id, pm.path)):
            self.apply(run, row)
        return True

    def apply(self, run: WalkRun, row: Row) -> None:
        """One row of a batched message (or one that waited) to the walk's member it is for."""
        fx, kind = self.fx, type(row)
        if kind is ValueRow:
            level = run.program.landing(row.node, len(row.path))
            outer, k = (row.path[:-1], row.path[-1]) if level.depth else ((), 0)
            member = run.members.get((level.id, outer))
            if member is None:
                fx.stash(run, (level.id, outer), row)
            else:
                member.put(k, row.node, row.output, row.value)
                fx.touch(member.cohort)
        elif kind is ItemRow:
            streams.push(fx, run, row.stream, row.prefix, row.index, row.value)
        elif kind is EndRow:
            streams.ended(fx, run, row.stream, row.prefix, row.n_items)
        elif kind is DecisionRow:
            member = run.members.get((row.scope, row.outer))
            if member is None:
                fx.stash(run, (row.scope, row.outer), row)
            else:
                iteration.decision(fx, member, row.k, row.end)
        else:
            streams.paused(fx, run, row.stream, row.prefix, row.pause)

    def advance(self) -> bool:
        """One pass of every cohort that may move; True if any did.

        A cohort whose pass only ended iterations (its members waited at the end for another
        rank) passes once more, after the others: its next iteration starts in this pass,
        together with the members the others' passes made join it. A cohort that moved passes
        again in the next heartbeat only when it left work that needs no message (``unfinished``):
        members that wait on another rank are not looked at again until their row comes.
        """
        fx = self.fx
        if not fx.dirty:
            return False
        self.deadlines.new_pass()
        dirty = fx.take_dirty()
        moved, again = False, []
        for cohort in dirty:
            if cohort.advance():
                moved = True
                if cohort.again:
                    again.append(cohort)
                elif cohort.unfinished:
                    fx.touch(cohort)
        for cohort in again:
            if cohort.advance() and cohort.unfinished:
                fx.touch(cohort)
        if self.gathered:
            self._run_gathered()
        return moved

    def pick(self, cohort: Cohort, unit: NodeUnit, engine: Engine, ready: list[Member], stay: list[Member]) -> list[Member]:
        """The members one step of ``unit`` takes (``deadlines``); the others wait in ``stay`` for a later pass."""
        if engine.gathers:  # its call after the pass picks across every cohort's members (``gathered``)
            take, wait = ready, []
        else:
            take, wait = self.deadlines.pick(unit.node, ready, engine.step_capacity())
        if unit.sends and self.split_steps and len(take) >= self.split_steps:
            half = (cohort.size() + len(ready) + 1) // 2  # of the cohort's members; ``ready`` left its bucket
            if len(take) > half:
                wait = take[half:] + wait
                take = take[:half]
                self.fx.count("split_steps")
        if wait:
            stay.extend(wait)
            self.fx.touch(cohort)
        return take

    def gather(self, engine: Engine, call: Call) -> None:
        self.gathered.setdefault(engine, []).append(call)

    def _run_gathered(self) -> None:
        """One call per gathering engine, with every cohort's groups of the pass (``Engine.gathers``)."""
        gathered, self.gathered = self.gathered, {}
        for engine, calls in gathered.items():
            calls = pick_gathered(self.deadlines, self.fx, calls, engine.step_capacity())
            if not calls:
                continue
            results = self.engines.call(engine, [c.group for c in calls])
            for call, answers in zip(calls, results):
                call.cohort.answered(call.unit, call.members, answers)

    def drop(self, rid: str) -> None:
        """With loop cohorts off, a released request's cohorts go."""
        if not self.batched:
            for key in [k for k in self.by_key if k[1] == rid]:
                self.fx.forget(self.by_key.pop(key))

    def members(self) -> int:
        return sum(c.members() for c in self.by_key.values())

    def yielded(self) -> int:
        """Members whose engine work goes on over passes (answered LATER, not yet done)."""
        return sum(c.yielded() for c in self.by_key.values())
