"""The part of one level that runs on one rank, for one set of local nodes: compiled once, cached.

A request's placement decides which nodes of a walk are on this rank; every
request with the same local nodes in a level shares one ``LocalLevel`` and,
with loop cohorts on, one cohort. Its units are the local direct nodes and the
child levels with something local, in the level's dependency order. A unit
*waits* only for what may not be here yet when the member reaches it: values
from other ranks, exit values of child levels, stream chunks. A node unit that
*joins the next* one shares its engine call: consecutive nodes of one
component that read nothing of each other in the iteration (a CFG step's
guidance passes) run as one ``Engine.run_groups`` call per step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from walkserve.graph.plan import INPUT, StreamInfo
from walkserve.worker.program import (
    CARRY,
    CHUNK,
    CUR,
    ENTRY,
    CarryRead,
    CurRead,
    EntryRead,
    ExitRoute,
    Key,
    LevelKind,
    NodeProgram,
    Read,
    WalkProgram,
)

if TYPE_CHECKING:
    from walkserve.worker.program import LevelProgram


@dataclass(frozen=True, slots=True, eq=False)
class NodeUnit:
    node: NodeProgram
    waits: tuple[Read, ...]  # reads whose value may not be here when the member gets to it
    sends: tuple[tuple[str, tuple[str, ...]], ...]  # (output, readers) read on other ranks too
    chunks: tuple[int, ...]  # streams whose chunk it consumes
    leaves: bool  # it has outputs that leave the iteration, and they go out as soon as it ran
    # its reads by kind, for the gather loop
    entry_reads: tuple[EntryRead, ...]
    cur_reads: tuple[CurRead, ...]
    carry_reads: tuple[CarryRead, ...]
    joins_next: bool = False  # the next unit runs in the same engine call (see the module doc)


@dataclass(frozen=True, slots=True, eq=False)
class ChildUnit:
    child: LocalLevel
    entry_cur: tuple[Key, ...]  # captured from the parent's iteration values
    entry_up: tuple[Key, ...]  # captured from the parent's own entries
    waits: tuple[Key, ...]  # of entry_cur, those that may not be there yet


@dataclass(frozen=True, eq=False)
class LocalLevel:
    program: WalkProgram
    level: LevelProgram
    local: frozenset[str]  # local nodes in the level or below
    units: tuple[NodeUnit | ChildUnit, ...]
    decides: bool  # this rank knows when an iteration ends (else a LoopEvents message says)
    awaits: bool  # a DynamicLoop whose stop node is elsewhere: each iteration waits for its decision
    stop_local: bool
    gate: tuple[StreamInfo, ...]  # fed streams consumed here: iteration k starts once chunk k exists
    produces: tuple[tuple[str, str, StreamInfo], ...]  # (node, output, stream) of local direct nodes
    client: tuple[tuple[str, str, str], ...]  # (node, output, modality) of local direct nodes
    walk_outputs: tuple[tuple[str, str, str], ...]  # (node, output, walk output), top level
    leaving: tuple[NodeProgram, ...]  # local direct nodes with outputs that leave the iteration
    exits: tuple[tuple[ExitRoute, int], ...]  # exit routes whose values gather here (their producer is local)
    gated: bool  # an iteration starts once its gate is open (a chunk it reads, no backpressure on what it feeds)

    @property
    def at_finish(self) -> bool:
        """Leaving outputs go out when the iteration's decision is known (not when produced)."""
        return self.level.droppable


def local_level(program: WalkProgram, lid: str, local: frozenset[str]) -> LocalLevel:
    key = (lid, local)
    found = program.local_levels.get(key)
    if found is None:
        found = program.local_levels[key] = _compile(program, lid, local)
    return found


def _compile(program: WalkProgram, lid: str, local: frozenset[str]) -> LocalLevel:
    level = program.levels[lid]
    units: list[NodeUnit | ChildUnit] = []
    here: set[str] = set()  # local direct nodes before the unit being compiled
    for name in level.units:
        if name in program.nodes:
            if name in local:
                units.append(_node_unit(program.nodes[name], here, local, not level.droppable))
                here.add(name)
        elif level_local := program.levels[name].subtree & local:
            units.append(_child_unit(program, program.levels[name], level_local, here))
    units = _join_stages(units)
    direct = [program.nodes[n] for n in level.nodes if n in local]
    stop_local = level.stop is not None and level.stop[0] in local
    gate = tuple(s for s in level.fed if s.consumer in local)
    kind = level.kind
    decides = kind is LevelKind.ROOT or kind is LevelKind.LOOP or stop_local or (kind is LevelKind.STREAM and bool(gate))
    return LocalLevel(
        program=program,
        level=level,
        local=local,
        units=tuple(units),
        decides=decides,
        awaits=kind is LevelKind.DYNAMIC and not stop_local,
        stop_local=stop_local,
        gate=gate,
        produces=tuple((n.name, out, program.streams[s]) for n in direct for out, s in n.streams),
        client=tuple((n.name, out, modality) for n in direct for out, modality in n.client),
        walk_outputs=tuple((n.name, out, name) for n in direct for out, name in n.walk_outputs),
        leaving=tuple(n for n in direct if n.client or n.streams or n.walk_outputs),
        exits=tuple((r, i) for r, i in level.exits if r.node in local),
        gated=bool(gate) or bool(level.produces),
    )


def _node_unit(node: NodeProgram, here: set[str], local: frozenset[str], now: bool) -> NodeUnit:
    waits = []
    for r in node.reads:
        if r.kind is CHUNK or (r.kind is CUR and r.node not in here) or (r.kind is CARRY and r.node not in local):
            waits.append(r)
    sends = tuple((out, readers) for out, readers in node.readers.items() if not set(readers) <= local)
    chunks = tuple(r.stream for r in node.reads if r.kind is CHUNK)
    leaves = now and bool(node.client or node.streams or node.walk_outputs)
    entry_reads = tuple(EntryRead(r.slot, r.key) for r in node.reads if r.kind is ENTRY)
    cur_reads = tuple(CurRead(r.slot, r.node, r.output) for r in node.reads if r.kind is CUR)
    carry_reads = tuple(CarryRead(r.slot, r.node, r.output, r.initial.key) for r in node.reads if r.kind is CARRY)
    return NodeUnit(node, tuple(waits), sends, chunks, leaves, entry_reads, cur_reads, carry_reads)


def _join_stages(units: list[NodeUnit | ChildUnit]) -> list[NodeUnit | ChildUnit]:
    """Mark each node unit whose successor runs on its component and reads none of the run's outputs."""
    out: list[NodeUnit | ChildUnit] = []
    run: set[str] = set()  # the nodes of the current run of joined units
    for unit, nxt in zip(units, [*units[1:], None]):
        if type(unit) is NodeUnit:
            run.add(unit.node.name)
            if type(nxt) is NodeUnit and nxt.node.component == unit.node.component \
                    and not any(r.kind is CUR and r.node in run for r in nxt.node.reads):
                unit = replace(unit, joins_next=True)
            else:
                run = set()
        out.append(unit)
    return out


def _child_unit(program: WalkProgram, child: LevelProgram, local: frozenset[str], here: set[str]) -> ChildUnit:
    keys: set[tuple[Key, str]] = set()
    for n in local:
        for r in program.nodes[n].reads:
            for read in (r, r.initial):
                if read is not None and read.kind is ENTRY and program.levels[read.landing].depth < child.depth:
                    keys.add((read.key, read.landing))
    entry_cur = tuple(sorted(k for k, landing in keys if landing == child.parent and k[0] != INPUT))
    entry_up = tuple(sorted(k for k, _ in keys if k not in entry_cur))
    waits = tuple(k for k in entry_cur if k[0] not in here)
    return ChildUnit(local_level(program, child.id, local), entry_cur, entry_up, waits)
