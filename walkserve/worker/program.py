"""The executor's program: a walk plan compiled once into levels, nodes and typed slot reads.

A *level* is the walk's top (ROOT) or one scope of the plan: a Loop, a
DynamicLoop, or a stream consumer's per-chunk scope. Every node sits directly
in one level; a level's *units* are its direct nodes and its child levels, in
dependency order. One instance of a level for one request (its outer path) is
a *member*; iteration k of a member runs the units in that order.

How a node's input slot finds its value in a member at iteration k:

    CUR    (node, out)  this iteration's output of a node of this level, or the
                        exit value of a child level that lands here
    CARRY  (node, out)  the previous iteration's output (k > 0); at k = 0 the
                        carry's initial value, an ENTRY read
    ENTRY  (node, out)  a value from outside this level, captured when the member
                        joined (the walk inputs are the top level's entries)
    CHUNK  stream       chunk k of that stream's buffer

A value leaving a loop (an *exit*) is combined per scope it leaves (last or
accumulated, innermost first) and lands in the level that encloses them all.
This module never imports torch; the program is pure data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from walkserve.core.errors import GraphError
from walkserve.graph.compose import LAST, DynamicLoop
from walkserve.graph.plan import (
    INPUT,
    FromCarry,
    FromEdge,
    FromStream,
    StreamInfo,
    ToClient,
    ToNode,
    ToOutput,
    ToStream,
    WalkPlan,
    iter_units,
)
from walkserve.graph.playback import Playback
from walkserve.graph.stop import Count, StopRule

ROOT = ""
Key = tuple[str, str]  # (node or "input", output)


class ReadKind(Enum):
    """How an input slot finds its value (see the module doc)."""

    CUR = "cur"
    CARRY = "carry"
    ENTRY = "entry"
    CHUNK = "chunk"


CUR, CARRY, ENTRY, CHUNK = ReadKind.CUR, ReadKind.CARRY, ReadKind.ENTRY, ReadKind.CHUNK


class LevelKind(Enum):
    """What a level is: the walk's top, a Loop, a DynamicLoop, or a stream consumer's per-chunk scope."""

    ROOT = "root"
    LOOP = "loop"
    DYNAMIC = "dynamic"
    STREAM = "stream"


class EntryRead(NamedTuple):
    """A slot's value captured from outside the level when the member joined."""

    slot: str
    key: Key


class CurRead(NamedTuple):
    """A slot's value from this iteration's output of a node of the level."""

    slot: str
    node: str
    output: str


class CarryRead(NamedTuple):
    """A slot's value from the previous iteration's output; at iteration 0 the entry ``initial``."""

    slot: str
    node: str
    output: str
    initial: Key


@dataclass(frozen=True, slots=True)
class Read:
    """Where one input slot's value comes from (see the module doc)."""

    slot: str
    kind: ReadKind
    node: str = ""
    output: str = ""
    stream: int = -1  # CHUNK
    initial: Read | None = None  # CARRY: the read of iteration 0
    landing: str = ROOT  # ENTRY: the level the value sits in (an enclosing one)
    key: Key = ("", "")  # (node, output), filled in

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.node, self.output))


@dataclass(frozen=True, slots=True, eq=False)
class ExitRoute:
    """One node output leaving ``levels`` (innermost first) and landing in ``landing``."""

    node: str
    output: str
    levels: tuple[str, ...]
    last: tuple[bool, ...]  # per level left: keep the last value (else accumulate)
    landing: str
    readers: tuple[str, ...]  # nodes reading the landed value (in the landing level or deeper)
    walk_output: str | None  # the walk output it fills, if any


@dataclass(frozen=True, slots=True)
class NodeProgram:
    name: str
    level: str
    component: str
    op: str
    outputs: tuple[str, ...]
    params: Mapping[str, Any]
    reads: tuple[Read, ...]
    readers: Mapping[str, tuple[str, ...]]  # output -> nodes reading its per-iteration value (carries too)
    client: tuple[tuple[str, str], ...]  # (output, modality)
    streams: tuple[tuple[str, int], ...]  # (output, stream index)
    walk_outputs: tuple[tuple[str, str], ...]  # (output, walk output), top level only
    exits: tuple[ExitRoute, ...]
    playback: Playback | None = None  # what a firing adds to the client's playback (a streamed path's node)
    downstream: tuple[str, ...] = ()  # the playback nodes after it on the walk's path, in order


@dataclass(frozen=True, slots=True)
class LevelProgram:
    id: str  # ROOT or the scope id
    kind: LevelKind
    depth: int  # enclosing scopes of its nodes, itself included (a member's path length)
    parent: str | None
    chain: tuple[str, ...]  # its scopes, outermost first (ROOT: ())
    nodes: tuple[str, ...]  # direct nodes
    units: tuple[str, ...]  # direct nodes and child levels, in dependency order
    subtree: frozenset[str]  # nodes in it or below
    bound: Count | None
    stop: tuple[str, str, StopRule] | None  # (node, output, rule) of a DynamicLoop
    fed: tuple[StreamInfo, ...]  # streams whose chunks drive its iterations
    produces: tuple[StreamInfo, ...]  # streams its direct nodes produce
    droppable: bool  # an iteration that ran may turn out not exposed (its leaving outputs wait)
    hold_at: str | None  # nearest droppable enclosing level: client outputs wait for it too
    exits: tuple[tuple[ExitRoute, int], ...]  # routes leaving through it, with its position in them

    @property
    def loop_like(self) -> bool:
        return self.kind is LevelKind.LOOP or self.kind is LevelKind.DYNAMIC


@dataclass(frozen=True)
class WalkProgram:
    walk: str
    plan: WalkPlan
    levels: Mapping[str, LevelProgram]
    nodes: Mapping[str, NodeProgram]
    streams: tuple[StreamInfo, ...]
    handed_on: tuple[tuple[str, str], ...]  # (walk input, walk output): an input handed on as an output
    local_levels: dict = field(default_factory=dict, compare=False, repr=False)  # cache of worker.local

    def level_of(self, node: str) -> LevelProgram:
        return self.levels[self.nodes[node].level]

    def landing(self, node: str, depth: int) -> LevelProgram:
        """The level a value of ``node`` keyed at a path of ``depth`` indices sits in (its own, or an exit's)."""
        chain = self.levels[self.nodes[node].level].chain
        return self.levels[chain[depth - 1] if depth else ROOT]


def compile_program(plan: WalkPlan) -> WalkProgram:
    """Derive everything the executor looks up from a validated plan, once."""
    return _Compiler(plan).run()


class _Compiler:
    def __init__(self, plan: WalkPlan):
        self.plan = plan
        self.level_of = {n: (c[-1] if c else ROOT) for n, c in plan.chains.items()}
        self.chain_of = {ROOT: (), **{sid: s.chain for sid, s in plan.scopes.items()}}
        self.readers: dict[tuple[str, str, tuple], list[str]] = defaultdict(list)

    def parent(self, level: str) -> str | None:
        if level == ROOT:
            return None
        chain = self.chain_of[level]
        return chain[-2] if len(chain) > 1 else ROOT

    def landing(self, source: FromEdge) -> str:
        if source.node == INPUT:
            return ROOT
        if source.exits:
            return self.parent(source.exits[-1]) or ROOT
        return self.level_of[source.node]

    def run(self) -> WalkProgram:
        plan = self.plan
        reads = {n: tuple(self.read(n, slot, plan.sources[(n, slot)]) for slot in node.inputs) for n, node in plan.nodes.items()}
        self.exit_list = self.exit_routes()
        levels = {lid: self.level(lid) for lid in self.chain_of}
        nodes = {n: self.node(n, reads[n]) for n in plan.nodes}
        _check_streams(plan, levels)
        handed_on = tuple((out, r.name) for (src, out), routes in plan.routes.items() if src == INPUT
                          for r in routes if isinstance(r, ToOutput))
        return WalkProgram(plan.name, plan, levels, nodes, tuple(plan.streams), handed_on)

    # ---- reads -----------------------------------------------------------------------------
    def read(self, node: str, slot: str, source: Any) -> Read:
        level = self.level_of[node]
        if isinstance(source, FromStream):
            return Read(slot, CHUNK, stream=source.stream)
        if isinstance(source, FromCarry):
            self.readers[(source.node, source.output, ())].append(node)
            initial = self.edge_read(node, slot, source.initial)
            if initial.kind != ENTRY:
                raise GraphError(f"walk {self.plan.name!r}: the initial value of carry into {node}.{slot} comes from its own loop")
            return Read(slot, CARRY, source.node, source.output, initial=initial)
        read = self.edge_read(node, slot, source)
        assert read.kind == CUR or level != ROOT or source.node == INPUT, (node, slot)
        return read

    def edge_read(self, node: str, slot: str, source: FromEdge) -> Read:
        level, landing = self.level_of[node], self.landing(source)
        if source.node != INPUT:
            self.readers[(source.node, source.output, tuple(source.exits))].append(node)
        if landing == level and source.node != INPUT:
            return Read(slot, CUR, source.node, source.output)
        assert landing == ROOT or landing in self.chain_of[level], (node, slot, landing)  # the plan's scoping rules
        return Read(slot, ENTRY, source.node, source.output, landing=landing)

    # ---- levels ----------------------------------------------------------------------------
    def level(self, lid: str) -> LevelProgram:
        plan, chain = self.plan, self.chain_of[lid]
        scope = plan.scopes.get(lid)
        kind = LevelKind.ROOT if scope is None else LevelKind(scope.kind)
        loop = scope.loop if scope is not None else None
        stop = None
        if isinstance(loop, DynamicLoop):
            stop_node, stop_out = loop.stop.output.split(".")
            stop = (stop_node, stop_out, loop.stop)
        fed = tuple(s for s in plan.streams if s.consumer_scope == lid)
        droppable = kind is LevelKind.DYNAMIC and (not stop[2].include_stopping or bool(fed))
        units = tuple(iter_units(plan, chain))
        parent = self.parent(lid)
        return LevelProgram(
            id=lid,
            kind=kind,
            depth=len(chain),
            parent=parent,
            chain=chain,
            nodes=tuple(n for n in units if n in plan.nodes),
            units=units,
            subtree=frozenset(n for n, c in plan.chains.items() if c[: len(chain)] == chain),
            bound=loop.iterations if loop is not None else None,
            stop=stop,
            fed=fed,
            produces=tuple(s for s in plan.streams if self.level_of[s.producer] == lid),
            droppable=droppable,
            hold_at=self.hold_at(parent),
            exits=tuple(self.exits_through(lid)),
        )

    def hold_at(self, level: str | None) -> str | None:
        while level is not None:
            scope = self.plan.scopes.get(level)
            if scope is not None and scope.kind == "dynamic":
                loop = scope.loop
                fed = any(s.consumer_scope == level for s in self.plan.streams)
                if not loop.stop.include_stopping or fed:
                    return level
            level = self.parent(level)
        return None

    def exit_routes(self) -> list[ExitRoute]:
        routes: dict[tuple, dict] = {}
        for (src, out), targets in self.plan.routes.items():
            for r in targets:
                if not isinstance(r, (ToNode, ToOutput)) or not r.exits:
                    continue
                entry = routes.setdefault((src, out, tuple(r.exits)), {"output": None})
                if isinstance(r, ToOutput):
                    entry["output"] = r.name
        out_routes = []
        for (src, out, exits), entry in sorted(routes.items(), key=lambda kv: kv[0]):
            last = tuple(self.plan.loop(s).outputs[f"{src}.{out}"] == LAST for s in exits)
            landing = self.parent(exits[-1]) or ROOT
            readers = tuple(self.readers.get((src, out, exits), ()))
            out_routes.append(ExitRoute(src, out, exits, last, landing, readers, entry["output"]))
        return out_routes

    def exits_through(self, lid: str) -> list[tuple[ExitRoute, int]]:
        return [(r, r.levels.index(lid)) for r in self.exit_list if lid in r.levels]

    # ---- nodes -----------------------------------------------------------------------------
    def node(self, name: str, reads: tuple[Read, ...]) -> NodeProgram:
        plan, gnode = self.plan, self.plan.nodes[name]
        client, streams, walk_outputs = [], [], []
        for out in gnode.outputs:
            for r in plan.routes.get((name, out), ()):
                if isinstance(r, ToClient):
                    client.append((out, r.modality))
                elif isinstance(r, ToStream):
                    streams.append((out, r.stream))
                elif isinstance(r, ToOutput) and not r.exits:
                    walk_outputs.append((out, r.name))
        return NodeProgram(
            name=name,
            level=self.level_of[name],
            component=gnode.component,
            op=gnode.op,
            outputs=tuple(gnode.outputs),
            params=gnode.params,
            reads=reads,
            readers={out: tuple(self.readers.get((name, out, ()), ())) for out in gnode.outputs},
            client=tuple(client),
            streams=tuple(streams),
            walk_outputs=tuple(walk_outputs),
            exits=tuple(r for r in self.exit_list if r.node == name),
            playback=plan.walk.playback.get(name),
            downstream=_after(tuple(plan.walk.playback), name),
        )


def _after(path: tuple[str, ...], name: str) -> tuple[str, ...]:
    return path[path.index(name) + 1:] if name in path else ()


def _check_streams(plan: WalkPlan, levels: Mapping[str, LevelProgram]) -> None:
    """A stream's producer loop and its consumer's scope must be siblings: both instances share one outer path."""
    for s in plan.streams:
        if levels[s.producer_scope].parent != levels[s.consumer_scope].parent:
            raise GraphError(
                f"walk {plan.name!r}: stream {s.producer}.{s.output} -> {s.consumer}.{s.slot} links loops "
                f"{s.producer_scope!r} and {s.consumer_scope!r}, which do not sit in the same enclosing level"
            )
