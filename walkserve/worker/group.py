"""A node unit's Group: the ready members' inputs gathered from their values, stream chunks and bound KV operations.

    entry reads   values captured when the member joined (the walk inputs at the top)
    cur reads     this iteration's outputs of the level's nodes
    carry reads   the previous iteration's (iteration 0: the carry's initial entry)
    chunks        chunk k of a stream, its items joined (``Effects.concat``) with its span
    kv            a KV-cache component's declared context operations bound to the inputs

A member that misses an input, or whose inputs do not fit its context
operations, fails its request here and is left out of the group.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from walkserve.engines.base import Group
from walkserve.engines.kv.ops import bind as bind_kv
from walkserve.worker.effects import Effects
from walkserve.worker.local import NodeUnit
from walkserve.worker.program import CHUNK, NodeProgram
from walkserve.worker.state import YIELDED, Member


def build_group(fx: Effects, unit: NodeUnit, ready: list[Member], kv_contexts: bool) -> tuple[list[Member], Group] | None:
    """The members that have their inputs, and their group; None if none has."""
    node = unit.node
    members, inputs, spans = _gather(fx, unit, ready)
    kv = None
    if members and kv_contexts:
        members, inputs, spans, kv = _bind(fx, node, members, inputs, spans)
    if not members:
        return None
    return members, Group(
        members[0].run.walk, node.name, node.component, node.op, node.outputs, node.params,
        [m.rid for m in members], [m.path for m in members], inputs,
        [m.run.request.params for m in members], [m.run.request.sampling_for(node.name) for m in members],
        kv=kv, spans=spans,
    )


def _gather(fx: Effects, unit: NodeUnit, ready: list[Member]) -> tuple[list[Member], list[dict], list[dict] | None]:
    """The inputs (and stream spans) of the members that have them; a missing output fails its request."""
    members, inputs = [], []
    entry_reads, cur_reads, carry_reads = unit.entry_reads, unit.cur_reads, unit.carry_reads
    spans: list[dict] | None = [] if unit.chunks else None
    for m in ready:
        inp: dict[str, Any] = {}
        entry = m.entry
        try:
            for slot, key in entry_reads:
                inp[slot] = entry[key]
            if cur_reads:
                cur = m.cur
                for slot, node, output in cur_reads:
                    inp[slot] = cur[node][output]
            if carry_reads:
                if m.k:
                    prev = m.prev
                    for slot, node, output, _ in carry_reads:
                        inp[slot] = prev[node][output]
                else:
                    for slot, _, _, key in carry_reads:
                        inp[slot] = entry[key]
        except KeyError:
            missing = next(r for r in unit.node.reads if r.slot not in inp)
            fx.fail(m.run, f"node {missing.node!r} returned no output {missing.output!r}, which node {unit.node.name!r} reads")
            continue
        if spans is not None:
            spans.append(_chunks(fx, m, unit.node.reads, inp))
        members.append(m)
        inputs.append(inp)
    return members, inputs, spans

def _chunks(fx: Effects, m: Member, reads: tuple, inp: dict) -> dict:
    sp = {}
    for r in reads:
        if r.kind is CHUNK:
            s = m.run.stream_in(r.stream, m.outer)
            chunk = s.buffer.chunk(m.k)
            inp[r.slot] = fx.concat(list(chunk.items), s.template)
            sp[r.slot] = chunk.span
    return sp

def _bind(fx: Effects, node: NodeProgram, members: list, inputs: list, spans: list | None) -> tuple[list, list, list | None, list]:
    """Each member's context operations bound to its inputs (a member whose inputs do not fit fails). A member the
    engine answered LATER gets None: its firing goes on there, bound when it was first offered (a fan of K
    members binds K operations per operation, too many to bind again at every pass)."""
    kept, kept_inputs, kept_spans, kv = [], [], [] if spans is not None else None, []
    for j, m in enumerate(members):
        try:
            kv.append(None if m.phase is YIELDED else bind_kv(node.name, node.params, inputs[j]))
        except ValueError as e:
            fx.fail(m.run, f"{node.component}: {e}")
            continue
        kept.append(m)
        kept_inputs.append(inputs[j])
        if spans is not None:
            kept_spans.append(spans[j])
    return kept, kept_inputs, kept_spans, kv


def subset(group: Group, rows: list[int]) -> Group:
    """The group of its members ``rows`` only, in that order."""
    def pick(values: list | None) -> list | None:
        return None if values is None else [values[j] for j in rows]
    return replace(group, request_ids=pick(group.request_ids), paths=pick(group.paths), inputs=pick(group.inputs),
                   params=pick(group.params), sampling=pick(group.sampling), kv=pick(group.kv), spans=pick(group.spans))
