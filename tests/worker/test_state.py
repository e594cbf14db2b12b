"""A member's phase in its iteration is one state with legal transitions (``state.Phase``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.worker.test_cohort import _executor, _start
from walkserve.worker.program import ROOT
from walkserve.worker.state import Member


def _root(gated: bool = True) -> Member:
    """The walk's top member, or (``gated``) one like it of a level with a gate (a stream-fed one)."""
    ex, _, _ = _executor()
    _start(ex, "r", 0, 1, steps=2)
    root = ex.requests["r"].walks["w"].members[(ROOT, ())]
    if not gated:
        return root
    return Member(root.run, replace(root.local, gated=True), (), None, dict(root.entry), None)


def test_a_level_without_a_gate_starts_its_iterations_at_once():
    m = _root(gated=False)
    assert m.phase.name == "RUNNING"
    m.next_iteration()
    assert m.phase.name == "RUNNING" and m.k == 1
    with pytest.raises(AssertionError, match="->"):
        m.open()


def test_a_member_goes_through_the_legal_phases():
    m = _root()
    seen = [m.phase]
    for step in (m.open, m.wait, m.answered, lambda: m.move_to(1), m.later, lambda: m.ran("a", {}),
                 m.next_iteration, m.stop):
        step()
        seen.append(m.phase)
    assert [p.name for p in seen] == ["GATED", "RUNNING", "WAITING", "ANSWERED", "RUNNING", "YIELDED", "RUNNING",
                                      "GATED", "ENDED"]
    assert not m.live and m.k == 1 and m.fired == 1 and m.cur == {}  # the next iteration starts empty


def test_a_member_a_gathered_call_had_no_room_for_runs_its_unit_again():
    m = _root()
    m.open()
    m.wait()
    m.deferred()
    assert m.phase.name == "RUNNING"
    m.wait()  # offered the unit again at the next pass
    assert m.phase.name == "WAITING"
    with pytest.raises(AssertionError, match="deferred"):
        m.answered()
        m.deferred()  # only a waiting member goes back


@pytest.mark.parametrize("path", [
    ("wait",),  # a gated member has no unit to wait on
    ("open", "wait", "move_to"),  # a waiting member moves on only once answered
    ("open", "later", "wait"),  # a yielded member is offered the same unit again, not a gathered one
    ("stop", "open"),  # an ended member stays ended
])
def test_an_illegal_phase_transition_is_refused(path):
    m = _root()
    *before, last = path
    for name in before:
        getattr(m, name)()
    phase = m.phase
    with pytest.raises(AssertionError, match="->"):
        m.move_to(1) if last == "move_to" else getattr(m, last)()
    assert m.phase is phase  # a refused transition changes nothing
