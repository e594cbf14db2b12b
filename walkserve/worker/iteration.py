"""Loop semantics, once: how an iteration starts and ends, what it exposes, and how an instance ends.

    start    an iteration begins once its gate is open: the chunk it reads
             exists (an exhausted stream ends the instance instead) and no
             consumer paused it (backpressure)
    end of k the rank that can decides: the stop rule (at the stop node's rank),
             the bound (a Loop), the next chunk (a stream scope); other ranks
             wait for that decision (LoopEvents). Then, if k is exposed, its
             leaving outputs go out (client rows, stream items; they wait for an
             enclosing droppable loop's decision when there is one) and its exit
             values gather; the carries are iteration k's values, read at k+1
    end      an instance that ended ends its streams, combines its exits (last or
             accumulated) and hands them to the level they land in, and its parent
             iteration goes on

An iteration that ran is always exposed unless the loop is *droppable*: a
DynamicLoop whose stop rule excludes the stopping iteration, or one driven by
a stream (whose end is found when iteration k has no chunk). Nothing runs
ahead of a decision, so nothing runs that is not exposed but those iterations.
"""

from __future__ import annotations

from typing import Any

from walkserve.protocol import messages as msg
from walkserve.streaming.buffer import EXHAUSTED
from walkserve.worker import streams
from walkserve.worker.effects import Effects
from walkserve.worker.local import ChildUnit
from walkserve.worker.program import ExitRoute, LevelKind
from walkserve.worker.state import Member, WalkRun

WAIT = object()
_MISSING = object()
_ROOT, _LOOP, _STREAM = LevelKind.ROOT, LevelKind.LOOP, LevelKind.STREAM


# ---- starting an iteration -----------------------------------------------------------------------
def gate(fx: Effects, m: Member) -> bool:
    """True once iteration k of ``m`` may start; an exhausted stream ends ``m`` here."""
    if m.paused:
        return False
    for info in m.local.gate:
        chunk = m.run.stream_in(info.index, m.outer).buffer.chunk(m.k)
        if chunk is None:
            return False
        if chunk is EXHAUSTED:
            claim_end(fx, m, m.k)
            return False
    m.open()
    return True


def claim_end(fx: Effects, m: Member, n: int) -> None:
    """This rank found that ``m`` has exactly ``n`` iterations: tell the other ranks and end it."""
    run, level = m.run, m.local.level
    for rank in m.others:
        fx.out.loop(rank, run.walk, level.id, m.rid, m.outer, m.k, n)
    end_member(fx, m, n)


# ---- outputs -------------------------------------------------------------------------------------
def client(fx: Effects, m: Member, node: str, out: str, modality: str, path: tuple, value: Any) -> None:
    """A client output, or a wait at the nearest enclosing droppable loop that has not decided yet."""
    hold = m.local.level.hold_at
    if hold is None:
        fx.out.client(m.run.walk, node, out, modality, m.rid, path, value)
        return
    a = m.parent
    while a.local.level.id != hold:
        a = a.parent
    a.hold((node, out, modality, path, value))


# ---- ending an iteration -------------------------------------------------------------------------
def decide(fx: Effects, m: Member) -> Any:
    """Iteration k of ``m`` ran here: None (k+1 follows), the exposed count if the instance ends, or WAIT."""
    local = m.local
    kind, k = local.level.kind, m.k
    if kind is _ROOT:
        return 1
    if local.stop_local:
        return _stop_rule(fx, m)
    if kind is _LOOP:
        return k + 1 if k + 1 >= m.bound else None
    if kind is _STREAM:  # a chunk that ran counts; the next one decides (here, or on the consumer's rank)
        return m.end if m.end is not None and m.end <= k + 1 else None
    if m.end is not None:
        return m.end
    return None if m.decided >= k else WAIT  # another rank decides


def _stop_rule(fx: Effects, m: Member) -> int | None:
    """The stop rule on iteration k, here at the stop node's rank: the exposed count if the loop ends."""
    run, level, k = m.run, m.local.level, m.k
    node, out, rule = level.stop
    values = m.cur.get(node)
    value = values.get(out, _MISSING) if values is not None else _MISSING
    if value is _MISSING:
        fx.fail(run, f"node {node!r} returned no output {out!r}, which the stop rule of loop {level.id!r} reads")
        return None
    try:
        stop = rule.should_stop(value, run.request.request_params, k)
    except Exception as e:
        fx.fail(run, f"stop rule of loop {level.id!r} failed: {type(e).__name__}: {e}")
        return None
    end = None
    if stop:
        end = k + 1 if rule.include_stopping else k
    elif k + 1 >= m.bound:
        end = k + 1
        run.bound_hit()
    for rank in m.others:
        fx.out.loop(rank, run.walk, level.id, m.rid, m.outer, k, -1 if end is None else end)
    return end


def expose(fx: Effects, m: Member) -> None:
    """Iteration k counts: outputs held for it move on, exit values gather."""
    held = m.take_held() if m.held is not None else None
    if held:
        for node, out, modality, path, value in held:
            client(fx, m, node, out, modality, path, value)
    exits = m.local.exits
    if not exits:
        return
    for route, i in exits:
        if i == 0:
            values = m.cur.get(route.node)
            value = values.get(route.output, _MISSING) if values is not None else _MISSING
        else:
            value = (m.exit_in or {}).get(route, _MISSING)
        if value is not _MISSING:
            m.gather(route, value, route.last[i])


# ---- ending an instance --------------------------------------------------------------------------
def end_member(fx: Effects, m: Member, n: int) -> None:
    """``m`` ran its last iteration, of which ``n`` are exposed."""
    m.stop()
    run, local = m.run, m.local
    level = local.level
    run.remove(m)
    for _, _, info in local.produces:
        streams.end(fx, run, info, m.outer, n)
    pm = m.parent
    for route, i in local.exits:
        values = m.acc.get(route, ()) if m.acc else ()
        if route.last[i]:
            if not values:
                fx.fail(run, f"loop {level.id!r} exposed no iteration, so {route.node}.{route.output} has no last value")
                return
            value = values[-1]
        else:
            value = fx.concat(list(values), None)
        if i + 1 < len(route.levels):
            pm.pass_up(route, value)
        else:
            land(fx, pm, route, value)
    if pm is None:
        fx.walk_done(run)
    else:
        pm.child_ended()
        fx.touch(pm.cohort)


def land(fx: Effects, pm: Member, route: ExitRoute, value: Any) -> None:
    """An exit value arrives in the level it lands in (``pm``'s), here and on the ranks that read it."""
    run = pm.run
    if route.walk_output is not None:
        walk_output(fx, run, route.walk_output, value)
    if route.readers:
        if not run.local.isdisjoint(route.readers):
            pm.put(pm.k, route.node, route.output, value)
            fx.touch(pm.cohort)
        for rank in run.remote_readers((route.node, route.output, route.levels), route.readers):
            fx.out.value(rank, run.walk, route.node, route.output, run.request.id, pm.path, value)


def walk_output(fx: Effects, run: WalkRun, name: str, value: Any) -> None:
    """A walk output: kept when this rank may start the next walk itself, else sent to the conductor."""
    if run.keep:
        run.output(name, value)
    else:
        fx.out.conductor(msg.WalkOut(run.request.id, run.walk, name, value))


def kill(fx: Effects, m: Member) -> None:
    """Drop ``m`` and everything it started in its current iteration, sending nothing."""
    m.stop()
    run = m.run
    run.remove(m)
    fx.touch(m.cohort)  # it drops ``m``, and admits the members that waited for ``m``'s iteration to end
    path = m.path
    for unit in m.local.units:
        if type(unit) is ChildUnit:
            child = run.members.get((unit.child.level.id, path))
            if child is not None:
                kill(fx, child)


def decision(fx: Effects, m: Member, k: int, end: int) -> None:
    """Another rank decided iteration ``k`` of ``m``: it continues (``end`` < 0) or ``end`` are exposed. Either way
    ``m``'s cohort looks again: ``m`` goes on, or it ended here, outside a pass of its cohort, which drops it and
    admits the members that waited for its iteration to end."""
    if end < 0:
        m.continue_to(k)
    else:
        m.ends_at(end)
        if m.k >= end:  # the current iteration is not exposed: drop what it started, and end
            path = m.path
            for unit in m.local.units:
                if type(unit) is ChildUnit and (child := m.run.members.get((unit.child.level.id, path))):
                    kill(fx, child)
            end_member(fx, m, end)
    fx.touch(m.cohort)
