"""The executor's per-request state on one rank: small objects, each owning its fields.

    RequestState   one request here: its parameters, sampling, and its walks
      WalkRun      one walk of it here: members by (level, outer path), stream buffers,
                   values that came before their member, counters
        Member     one instance of one level (a loop instance, a stream scope's instance,
                   or the walk's top): its iteration, this iteration's values, carries
        StreamIn   one stream's buffer at its consumer, with the items' reorder window

Bookkeeping only: values are opaque (tensors in practice), no torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from walkserve.streaming.buffer import StreamBuffer

if TYPE_CHECKING:
    from walkserve.core.request import RequestSpec
    from walkserve.core.sampling import SamplingParams
    from walkserve.worker.local import LocalLevel
    from walkserve.worker.program import WalkProgram

Path = tuple[int, ...]


class RequestState:
    """A request on this rank, from its first StartWalk until its Release."""

    __slots__ = ("failed", "id", "node_sampling", "params", "sampling", "spec", "sticky", "walks")

    def __init__(
        self, request_id: str, params: Mapping[str, Any], sampling: SamplingParams | None,
        node_sampling: Mapping[str, SamplingParams] | None = None,
    ):
        self.id = request_id
        self.params, self.sampling = params, sampling
        self.node_sampling = node_sampling or {}  # node -> its own sampling, overriding ``sampling``
        self.spec: RequestSpec | None = None  # set when this rank may pick the request's next walk itself
        self.sticky: dict[str, int] = {}  # component -> the rank it runs on for this request
        self.walks: dict[str, WalkRun] = {}
        self.failed = False

    def sampling_for(self, node: str) -> SamplingParams | None:
        """The node's own sampling for this request, else the request's."""
        own = self.node_sampling
        return own.get(node, self.sampling) if own else self.sampling

    def fail(self) -> None:
        """The request cannot go on here: every member of every walk stops."""
        self.failed = True
        for run in self.walks.values():
            run.stop()

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
        "program", "rank", "ranks", "request", "streams", "targets",
    )

    def __init__(self, request: RequestState, program: WalkProgram, ranks: Mapping[str, int], rank: int):
        self.request, self.program, self.rank = request, program, rank
        self.ranks = dict(ranks)
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
        "acc", "ahead", "bound", "busy", "children", "cohort", "cur", "decided", "end", "entry", "exit_in", "fired",
        "held", "k", "live", "local", "others", "outer", "parent", "path", "paused", "pos", "prev", "rid", "run",
        "started", "unit_done", "yielded",
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
        self.started = False  # iteration k passed its gate (stream chunk, backpressure)
        self.busy = 0  # engine firings of the current unit not answered yet
        self.unit_done = False  # the current unit's firings were answered
        self.yielded = False  # the engine answered LATER: its work goes on, the member is offered again
        self.children = 0  # child instances started this iteration that have not ended
        self.held: list | None = None  # outputs of deeper levels waiting for this member's decision
        self.exit_in: dict | None = None  # exit values children passed up this iteration, by route
        self.acc: dict | None = None  # exit route -> values of the exposed iterations so far
        self.paused = False  # a consumer of a stream it produces is full
        self.live = True
        self.cohort: Any = None  # the cohort stepping it

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

    def stop(self) -> None:
        self.live = False

    def next_iteration(self) -> None:
        k = self.k = self.k + 1
        self.prev, self.path = self.cur, (*self.outer, k)
        ahead = self.ahead
        self.cur = ahead.pop(k, {}) if ahead else {}
        self.pos, self.started, self.exit_in = 0, False, None
