"""The executor's per-request state on one rank: small objects, each owning its fields.

    RequestState   one request here: its parameters, sampling, and its walks
      WalkRun      one walk of it here: members by (level, outer path), stream buffers,
                   values that came before their member, counters
        Member     one instance of one level (a loop instance, a stream scope's instance,
                   or the walk's top): its iteration, this iteration's values, carries
        StreamIn   one stream's buffer at its consumer, with the items' reorder window

A field is written only by its own class's methods (``tests/worker/test_layering.py``
checks it). Where a member is in its iteration is one ``Phase``:

    GATED ──▶ RUNNING ──▶ WAITING ──▶ ANSWERED ──▶ RUNNING ...   (a gathering engine's call;
                            └──▶ RUNNING                          no room in it: offered again)
      ▲          │ ──▶ YIELDED ──▶ RUNNING                       (an engine answered LATER)
      └──────────┘ next iteration          any ──▶ ENDED         (ended, failed, released)

(a level without a gate, ``LocalLevel.gated``, skips GATED: its iterations start at once).

Bookkeeping only: values are opaque (tensors in practice), no torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any

from walkserve.core.params import Params, RequestParams
from walkserve.core.sampling import SamplingParams
from walkserve.engines.base import LATER
from walkserve.streaming.buffer import StreamBuffer

if TYPE_CHECKING:
    from walkserve.core.request import RequestSpec
    from walkserve.worker.local import LocalLevel
    from walkserve.worker.program import WalkProgram

Path = tuple[int, ...]


class Phase(Enum):
    GATED = "gated"  # at the start of iteration k, its gate not passed yet (stream chunk, backpressure)
    RUNNING = "running"  # in iteration k, at unit ``pos``
    WAITING = "waiting"  # its unit's group waits for a gathering engine's call after the pass
    ANSWERED = "answered"  # that call answered: it moves on at the next pass
    YIELDED = "yielded"  # the engine answered LATER: the unit is offered again at the next pass
    ENDED = "ended"  # ended, failed or released: its cohort drops it


GATED, RUNNING, WAITING, ANSWERED, YIELDED, ENDED = Phase
_LEGAL: dict[Phase, frozenset[Phase]] = {
    GATED: frozenset({RUNNING, ENDED}),
    RUNNING: frozenset({WAITING, YIELDED, GATED, ENDED}),
    WAITING: frozenset({ANSWERED, ENDED}),
    ANSWERED: frozenset({RUNNING, ENDED}),
    YIELDED: frozenset({RUNNING, ENDED}),
    ENDED: frozenset(),
}


class RequestState:
    """A request on this rank, from its first StartWalk until its Release."""

    __slots__ = ("failed", "id", "node_sampling", "params", "request_params", "sampling", "spec", "sticky", "stream",
                 "walks")

    def __init__(
        self, request_id: str, params: Params, sampling: SamplingParams | None,
        node_sampling: Mapping[str, SamplingParams] | None = None, stream: bool = False,
    ):
        self.stream = stream  # its audio plays as it streams: scheduled by playback deadlines (StartWalk.stream)
        self.id = request_id
        self.params, self.sampling = params, sampling  # the family's typed params go to the components as they are
        self.request_params = RequestParams(params, sampling or SamplingParams())  # what stop rules and counts read
        self.node_sampling = node_sampling or {}  # node -> its own sampling, overriding ``sampling``
        self.spec: RequestSpec | None = None  # set when this rank may pick the request's next walk itself
        self.sticky: dict[str, int] = {}  # component -> the rank it runs on for this request
        self.walks: dict[str, WalkRun] = {}
        self.failed = False

    def sampling_for(self, node: str) -> SamplingParams | None:
        """The node's own sampling for this request, else the request's."""
        own = self.node_sampling
        return own.get(node, self.sampling) if own else self.sampling

    def may_pick(self, spec: RequestSpec, sticky: Mapping[str, int]) -> None:
        """This rank may pick the request's next walk itself: the request, and where it sticks."""
        self.spec, self.sticky = spec, dict(sticky)

    def start(self, program: WalkProgram, ranks: Mapping[str, int], rank: int) -> WalkRun:
        run = self.walks[program.walk] = WalkRun(self, program, ranks, rank)
        return run

    def fail(self) -> list[Member]:
        """The request cannot go on here: every member of every walk stops; returns them (their cohorts look once
        more, to drop them: a release finds none left to stop)."""
        self.failed = True
        stopped = []
        for run in self.walks.values():
            stopped += run.members.values()
            run.stop()
        return stopped

    def stop(self) -> list[Member]:
        """Released: every member stops; returns them (their cohorts look once more, to drop them)."""
        stopped = []
        for run in self.walks.values():
            stopped += run.members.values()
            for member in run.members.values():
                member.stop()
        return stopped


class WalkRun:
    """One request's walk on this rank."""

    __slots__ = (
        "done", "early", "firings", "hit_bound", "keep", "level_ranks", "local", "local_sets", "members", "outputs",
        "program", "rank", "ranks", "request", "streamed", "streams", "targets",
    )

    def __init__(self, request: RequestState, program: WalkProgram, ranks: Mapping[str, int], rank: int):
        self.request, self.program, self.rank = request, program, rank
        self.ranks = dict(ranks)
        # its audio plays as it streams (the request asked so, or the walk declares playback): deadline-scheduled
        self.streamed = request.stream or bool(program.plan.walk.playback)
        self.local = frozenset(n for n in program.nodes if self.ranks.get(n) == rank)
        self.local_sets = {lid: lv.subtree & self.local for lid, lv in program.levels.items()}
        self.members: dict[tuple[str, Path], Member] = {}
        self.early: dict[tuple[str, Path], list[Any]] = {}  # messages for a member that has not joined yet
        self.streams: dict[tuple[int, Path], StreamIn] = {}
        self.targets: dict[tuple, tuple[int, ...]] = {}  # a value -> the other ranks that read it
        self.level_ranks: dict[str, tuple[int, ...]] = {}  # level -> other ranks hosting part of it
        self.keep = False  # every node is here and the request is known: this rank may start the next walk
        self.outputs: dict[str, Any] = {}  # walk outputs kept while ``keep``
        self.firings = 0
        self.hit_bound = False
        self.done = False

    @property
    def walk(self) -> str:
        return self.program.walk

    @property
    def all_local(self) -> bool:
        return len(self.local) == len(self.program.nodes)

    def remote_readers(self, key: tuple, readers: tuple[str, ...]) -> tuple[int, ...]:
        """The other ranks that host one of ``readers`` (``key`` names the value, for the cache)."""
        ranks = self.targets.get(key)
        if ranks is None:
            ranks = self.targets[key] = tuple(sorted({self.ranks[r] for r in readers} - {self.rank}))
        return ranks

    def others(self, level: str) -> tuple[int, ...]:
        """The other ranks that host a node of ``level`` (or below) for this request."""
        ranks = self.level_ranks.get(level)
        if ranks is None:
            sub = self.program.levels[level].subtree
            ranks = self.level_ranks[level] = tuple(sorted({self.ranks[n] for n in sub} - {self.rank}))
        return ranks

    def keep_here(self, handed_on: Mapping[str, Any]) -> None:
        """This rank may start the next walk: walk outputs stay here (the inputs handed on among them)."""
        self.keep = True
        self.outputs.update(handed_on)

    def output(self, name: str, value: Any) -> None:
        self.outputs[name] = value

    def bound_hit(self) -> None:
        self.hit_bound = True

    def add(self, member: Member) -> None:
        self.members[(member.local.level.id, member.outer)] = member

    def remove(self, member: Member) -> None:
        """``member`` ended: its firings count, it is no longer looked up."""
        self.firings += member.fired
        self.members.pop((member.local.level.id, member.outer), None)

    def take_early(self, key: tuple[str, Path]) -> list[Any]:
        """The rows that waited for the member at ``key``, which joins now."""
        return self.early.pop(key, [])

    def stash(self, key: tuple[str, Path], row: Any) -> None:
        """A row for a member that has not joined here yet (it takes them when it joins)."""
        self.early.setdefault(key, []).append(row)

    def finish(self) -> None:
        self.done = True
        self.early.clear()

    def stop(self) -> None:
        for member in self.members.values():
            member.stop()
        self.members.clear()

    def stream_in(self, stream: int, prefix: Path) -> StreamIn:
        key = (stream, prefix)
        s = self.streams.get(key)
        if s is None:
            info = self.program.streams[stream]
            s = self.streams[key] = StreamIn(StreamBuffer(info.policy, info.capacity))
        return s


class StreamIn:
    """A stream's buffer at its consumer; items that arrive out of order wait in ``early``."""

    __slots__ = ("buffer", "early", "pausing", "template")

    def __init__(self, buffer: StreamBuffer):
        self.buffer = buffer
        self.early: dict[int, Any] | None = None
        self.template: Any = None  # the first item: an empty chunk takes its dtype and trailing shape
        self.pausing = False  # the producer was asked to pause

    def ask_pause(self, pause: bool) -> bool:
        """Whether the producer must be told: True when ``pause`` changes what it was asked."""
        if self.pausing == pause:
            return False
        self.pausing = pause
        return True

    def push(self, index: int, value: Any) -> None:
        buf = self.buffer
        if index != buf.n_items:
            if self.early is None:
                self.early = {}
            self.early[index] = value
            return
        if self.template is None:
            self.template = value
        buf.push(value)
        early = self.early
        while early and buf.n_items in early:
            buf.push(early.pop(buf.n_items))


class Member:
    """One instance of one level on this rank, stepping through its iterations.

    ``cur`` holds iteration k's values by node (a local node's outputs as the
    engine returned them, values from other ranks, exit values landing here);
    ``prev`` iteration k-1's (what carries read); ``ahead`` values that came
    from other ranks for later iterations. ``pos`` is the unit the member is at.
    """

    __slots__ = (
        "acc", "ahead", "bound", "children", "cohort", "cur", "decided", "end", "entry", "exit_in", "fired",
        "held", "k", "local", "others", "outer", "parent", "path", "paused", "phase", "pos", "prev", "rid", "run",
    )

    def __init__(self, run: WalkRun, local: LocalLevel, outer: Path, parent: Member | None, entry: dict, bound: int | None):
        self.run, self.local, self.outer, self.parent = run, local, outer, parent
        self.rid = run.request.id
        self.others = run.others(local.level.id)  # other ranks with a part of this level for the request
        self.entry = entry  # (node, output) -> value captured from outside the level
        self.bound = bound  # iterations at most (None: until the stream ends)
        self.k = 0
        self.path: Path = (*outer, 0) if local.level.depth else ()  # the current iteration's path
        self.pos = 0
        self.fired = 0  # node instances run
        self.cur: dict[str, dict[str, Any]] = {}
        self.prev: dict[str, dict[str, Any]] = {}
        self.ahead: dict[int, dict[str, dict[str, Any]]] | None = None
        self.end: int | None = None  # exposed iterations, once known
        self.decided = -1  # iterations <= decided continue (decisions from another rank)
        self.phase = GATED if local.gated else RUNNING  # a level without a gate starts its iterations at once
        self.children = 0  # child instances started this iteration that have not ended
        self.held: list | None = None  # outputs of deeper levels waiting for this member's decision
        self.exit_in: dict | None = None  # exit values children passed up this iteration, by route
        self.acc: dict | None = None  # exit route -> values of the exposed iterations so far
        self.paused = False  # a consumer of a stream it produces is full
        self.cohort: Any = None  # the cohort stepping it

    # ---- its phase -----------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        return self.phase is not ENDED

    def _to(self, phase: Phase) -> None:
        assert phase in _LEGAL[self.phase], f"member {self.rid} {self.path}: {self.phase.name} -> {phase.name}"
        self.phase = phase

    def joined(self, cohort: Any) -> None:
        self.cohort = cohort

    def open(self) -> None:
        """Iteration k passed its gate."""
        assert self.phase is GATED, f"member {self.rid} {self.path}: {self.phase.name} -> RUNNING"
        self.phase = RUNNING

    def wait(self) -> None:
        """Its unit's group waits for a gathering engine's call."""
        self._to(WAITING)

    def answered(self) -> None:
        self._to(ANSWERED)

    def deferred(self) -> None:
        """The gathering engine's call had no room for it: it is offered its unit again at the next pass (the one
        way back from WAITING without an answer)."""
        assert self.phase is WAITING, f"member {self.rid} {self.path}: {self.phase.name} -> deferred"
        self.phase = RUNNING

    def later(self) -> None:
        """The engine answered LATER: the member is offered the unit again."""
        if self.phase is not YIELDED:
            self._to(YIELDED)

    def ran(self, node: str, outputs: dict[str, Any]) -> None:
        """``node`` ran for this iteration: its outputs."""
        self.cur[node] = outputs
        self.fired += 1
        if self.phase is YIELDED:
            self._to(RUNNING)

    @staticmethod
    def take(members: list[Member], node: str, results: list, may_wait: bool) -> tuple[list, list, list]:
        """The results of one engine call for ``node``, per member: (the members that ran, with their outputs
        kept; those answered LATER, offered again; (member, result) of those that failed). Ended members are
        left out. One call for a group: ``ran`` and ``later`` for each member, in one loop."""
        ran, later, failed = [], [], []
        for m, out in zip(members, results):
            phase = m.phase
            if phase is ENDED:  # failed by another unit of the same call
                continue
            if type(out) is dict:
                m.cur[node] = out
                m.fired += 1
                if phase is YIELDED:
                    m.phase = RUNNING
                ran.append(m)
            elif out is LATER and may_wait:
                if phase is not YIELDED:
                    m._to(YIELDED)
                later.append(m)
            else:
                failed.append((m, out))
        return ran, later, failed

    @staticmethod
    def move_all(members: list[Member], pos: int, into: list[Member]) -> None:
        """``move_to`` for each member still live, appended to ``into`` (the bucket of unit ``pos``)."""
        for m in members:
            phase = m.phase
            if phase is not ENDED:
                if phase is not RUNNING:
                    m._to(RUNNING)
                m.pos = pos
                into.append(m)

    def move_to(self, pos: int) -> None:
        """On to unit ``pos`` of the iteration."""
        if self.phase is not RUNNING:
            self._to(RUNNING)
        self.pos = pos

    def stop(self) -> None:
        self.phase = ENDED

    # ---- its iteration's bookkeeping -------------------------------------------------------------
    def child_started(self) -> None:
        self.children += 1

    def child_ended(self) -> None:
        self.children -= 1

    def continue_to(self, k: int) -> None:
        """Another rank decided that iterations up to ``k`` continue."""
        if k > self.decided:
            self.decided = k

    def ends_at(self, end: int) -> None:
        """Another rank decided: ``end`` iterations are exposed."""
        self.end = end

    def pause(self, pause: bool) -> None:
        self.paused = pause

    def hold(self, item: tuple) -> None:
        """A deeper level's client output waits for this member's decision."""
        if self.held is None:
            self.held = []
        self.held.append(item)

    def take_held(self) -> list | None:
        held, self.held = self.held, None
        return held

    def gather(self, route: Any, value: Any, last: bool) -> None:
        """An exposed iteration's exit value: kept as the last, or accumulated."""
        acc = self.acc
        if acc is None:
            acc = self.acc = {}
        if last:
            acc[route] = [value]
        else:
            acc.setdefault(route, []).append(value)

    def pass_up(self, route: Any, value: Any) -> None:
        """A child's combined exit value on its way out through this level too."""
        if self.exit_in is None:
            self.exit_in = {}
        self.exit_in[route] = value

    def put(self, k: int, node: str, output: str, value: Any) -> None:
        """A value for iteration ``k`` from another rank (or a child's exit).

        A member may have gone on to k+1 before a value of k arrives when nothing
        here reads it at k: only a carry can still want it (as k+1's previous).
        """
        if k == self.k:
            target = self.cur
        elif k > self.k:
            if self.ahead is None:
                self.ahead = {}
            target = self.ahead.setdefault(k, {})
        elif k == self.k - 1:
            target = self.prev
        else:
            return  # older: nothing here reads it any more
        node_values = target.get(node)
        if node_values is None:
            target[node] = {output: value}
        else:
            node_values[output] = value

    @staticmethod
    def put_rows(members: list[Member | None], paths: list[Path], node: str, output: str,
                 values: list) -> tuple[list[int], list[Any]]:
        """``put`` of each row's value into its member (row i: ``members[i]``, at iteration ``paths[i][-1]``) when that
        member is live and the instance at ``paths[i][:-1]``. Returns the rows it left (for the long way) and the
        cohorts of the members it reached. One loop for a message's rows, the common case (this iteration) inline."""
        left, cohorts, last = [], [], None
        for i, (m, path, value) in enumerate(zip(members, paths, values, strict=True)):
            if m is None or m.phase is ENDED or m.run.done or not path or m.outer != path[:-1]:
                left.append(i)
                continue
            k = path[-1]
            if k != m.k:
                m.put(k, node, output, value)
            else:
                node_values = m.cur.get(node)
                if node_values is None:
                    m.cur[node] = {output: value}
                else:
                    node_values[output] = value
            if m.cohort is not last:
                last = m.cohort
                cohorts.append(last)
        return left, cohorts

    @staticmethod
    def continue_rows(members: list[Member | None], outers: list[Path], ks: list[int],
                      ends: list[int]) -> tuple[list[int], list[Any]]:
        """``continue_to`` for each row that says its member's iteration continues (``ends[i]`` < 0), when that member
        is live and the instance at ``outers[i]``. Returns the rows it left (ends, and the others) and the cohorts of
        the members it reached."""
        left, cohorts, last = [], [], None
        for i, (m, outer, k, end) in enumerate(zip(members, outers, ks, ends, strict=True)):
            if end >= 0 or m is None or m.phase is ENDED or m.run.done or m.outer != outer:
                left.append(i)
                continue
            if k > m.decided:
                m.decided = k
            if m.cohort is not last:
                last = m.cohort
                cohorts.append(last)
        return left, cohorts

    def next_iteration(self) -> None:
        k = self.k = self.k + 1
        self.prev, self.path = self.cur, (*self.outer, k)
        ahead = self.ahead
        self.cur = ahead.pop(k, {}) if ahead else {}
        assert self.phase is RUNNING, f"member {self.rid} {self.path}: {self.phase.name} -> the next iteration"
        self.pos, self.exit_in = 0, None
        if self.local.gated:
            self.phase = GATED
