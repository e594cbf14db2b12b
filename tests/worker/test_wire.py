"""A split step's rows on the wire: one stacked payload per edge and peer, each member given its own row.

Two ranks in one process (``a`` on rank 0, ``b`` on rank 1, the carry ``b.x -> a.x`` and the stop rule's
decision going back), every frame between them through the worker's real path: ``wire.pack``, the codec,
``wire.unpack_message``, ``Executor.receive``.
"""

from __future__ import annotations

import zlib
from collections import defaultdict

import pytest

from walkserve.core.request import RequestSpec
from walkserve.engines.base import Group
from walkserve.models.base import ModelRef
from walkserve.protocol import messages as m
from walkserve.testing.fixtures.base import FixtureParams
from walkserve.testing.fixtures.bench import NullBench
from walkserve.testing.simulator import GroupOnlyEngine
from walkserve.testing.wire_sim import WireSimulator
from walkserve.worker.executor import Executor

BATCH, STEPS = 64, 5


def _n(rid: str) -> int:
    return zlib.crc32(rid.encode()) % 1000


class _Mix(GroupOnlyEngine):
    """a: y = 2x + (a number of the request); b: x = y + 1. Each member's outputs depend on its own rows.

    ``ragged``: a's y is that value repeated 1-3 times (by request), so a step's rows differ in shape, and b
    reads its first element. ``fail``: b fails that request at that iteration."""

    def __init__(self, component: str, ragged: bool = False, fail: tuple[str, int] | None = None):
        self.component, self.ragged, self.fail = component, ragged, fail

    def run_group(self, group: Group) -> list:
        if self.component == "a":
            return [{"y": (inp["x"] * 2 + _n(rid)).repeat(1 + _n(rid) % 3 if self.ragged else 1)}
                    for rid, inp in zip(group.request_ids, group.inputs, strict=True)]
        return [f"no b for {rid}" if (rid, path[-1]) == self.fail else {"x": inp["y"][:1] + 1}
                for rid, path, inp in zip(group.request_ids, group.paths, group.inputs, strict=True)]


class _WireSim(WireSimulator):
    """The fixture's loop with ``_Mix`` engines; ``per_row`` sends each Values row as its own message."""

    def __init__(self, ranks: dict[str, int], per_row: bool = False, **mix):
        graph = NullBench(ModelRef("fixture-bench-null", None, {})).graph()
        super().__init__(graph, ranks, lambda rank: {c: _Mix(c, **mix) for c in ("a", "b")})
        self.per_row = per_row
        self.values_sent: list[tuple[int, m.Values]] = []  # (rank, Values as packed)

    def packed(self, rank: int, msg) -> None:
        if isinstance(msg, m.Values):
            self.values_sent.append((rank, msg))

    def parts(self, msg):
        if not (self.per_row and isinstance(msg, m.Values)):
            return [msg]
        return [m.Values(msg.walk, msg.node, msg.output, [rid], [path], values=[v])
                for rid, path, v in zip(msg.request_ids, msg.paths, msg.values, strict=True)]


def _run(sim: _WireSim, steps: list[int] | None = None) -> tuple[list[list], list[list]]:
    """Each request's client outputs as (node, path, value), and what the formula says they are (``steps``: each
    request's loop steps, STEPS by default)."""
    for r in range(2):
        sim.executor(r)
    steps = steps or [STEPS] * BATCH
    specs = [RequestSpec({}, params=FixtureParams(steps=n)) for n in steps]
    for spec in specs:
        sim.submit(spec)
    results = sim.run()
    got = [[(o.node, tuple(o.path), o.value.tolist()) for o in results[s.id].outputs] for s in specs]
    return got, [_expected(s.id, n) for s, n in zip(specs, steps, strict=True)]


def _expected(rid: str, steps: int = STEPS) -> list:
    x, out = 1, []
    for k in range(steps):
        x = 2 * x + _n(rid) + 1
        out.append(("b", (k,), [x]))
    return out


@pytest.mark.parametrize("per_row", [False, True], ids=["one-payload", "per-row"])
def test_a_split_steps_rows_cross_as_one_payload_and_each_member_gets_its_own(per_row):
    sim = _WireSim({"a": 0, "b": 1}, per_row=per_row)
    got, expected = _run(sim)
    assert got == expected
    sent = sim.values_sent
    assert {rank for rank, _ in sent} == {0, 1}  # a.y to rank 1, the carry b.x back to rank 0
    for _, msg in sent:
        assert msg.values == []  # the rows travel in the stacked payload, none as a tensor of its own
        assert msg.stacked is not None and msg.stacked.shape[0] == len(msg.request_ids)
    if per_row:
        assert all(len(msg.request_ids) == 1 for _, msg in sent)
    else:  # the members step in lockstep: a step's rows for the peer are one message of all 64
        assert all(len(msg.request_ids) == BATCH for _, msg in sent)
        assert len(sent) == 2 * STEPS  # one each way per step


def test_the_split_loop_gives_what_the_same_loop_gives_on_one_rank():
    for ranks in ({"a": 0, "b": 1}, {"a": 0, "b": 0}):
        got, expected = _run(_WireSim(ranks))
        assert got == expected, ranks


def test_ragged_rows_travel_one_by_one_and_each_member_gets_its_own():
    sim = _WireSim({"a": 0, "b": 1}, ragged=True)
    got, expected = _run(sim)
    assert got == expected
    ys = [msg for rank, msg in sim.values_sent if rank == 0]
    assert len(ys) == STEPS and all(len(msg.request_ids) == BATCH for msg in ys)
    for msg in ys:  # shapes differ: no stacked payload, one tensor per row, each of its own request's length
        assert msg.stacked is None and len(msg.values) == BATCH
        assert [v.shape for v in msg.values] == [(1 + _n(rid) % 3,) for rid in msg.request_ids]
    assert len({v.shape for msg in ys for v in msg.values}) == 3
    xs = [msg for rank, msg in sim.values_sent if rank == 1]
    assert all(msg.stacked is not None and msg.values == [] for msg in xs)  # b's rows have one shape: stacked


def _one_by_one(monkeypatch) -> dict[tuple[int, str], int]:
    """Counts the rows each rank looked up one by one, per message kind."""
    counts: dict[tuple[int, str], int] = defaultdict(int)
    for name in ("_values_one_by_one", "_loops_one_by_one"):
        original = getattr(Executor, name)

        def counted(ex, msg, rows, members, _original=original, _name=name):
            rows = list(rows)
            counts[ex.rank, _name] += len(rows)
            _original(ex, msg, rows, members)

        monkeypatch.setattr(Executor, name, counted)
    return counts


def test_a_steps_rows_go_to_the_members_the_last_steps_rows_reached(monkeypatch):
    counts = _one_by_one(monkeypatch)
    got, expected = _run(_WireSim({"a": 0, "b": 1}))
    assert got == expected
    # each kind of message looks its members up once (the first step); the next steps' rows reach the same ones,
    # but for the ends of the loops (the last step's decisions), which always go the long way
    assert dict(counts) == {(1, "_values_one_by_one"): BATCH, (0, "_values_one_by_one"): BATCH,
                            (0, "_loops_one_by_one"): 2 * BATCH}


def test_rows_of_requests_that_ended_or_failed_meanwhile_go_the_long_way(monkeypatch):
    """Half the requests stop after 2 steps and one fails on rank 1 at step 3, while the others go on: every
    request still gets exactly its own outputs, and the failed one its error."""
    counts = _one_by_one(monkeypatch)
    specs = [RequestSpec({}, params=FixtureParams(steps=2 if i % 2 else STEPS)) for i in range(BATCH)]
    failing = specs[0].id  # one of the long ones
    sim = _WireSim({"a": 0, "b": 1}, fail=(failing, 3))
    for r in range(2):
        sim.executor(r)
    for spec in specs:
        sim.submit(spec)
    results = sim.run()
    assert results[failing].error is not None and f"no b for {failing}" in results[failing].error
    for spec in specs[1:]:
        got = [(o.node, tuple(o.path), o.value.tolist()) for o in results[spec.id].outputs]
        assert results[spec.id].error is None
        assert got == _expected(spec.id, spec.params.steps)
    # rank 1 looked each request's a.y row up the long way once (the first step), not once per step
    assert counts[1, "_values_one_by_one"] == BATCH


def test_a_rank_waiting_for_the_other_ranks_rows_is_not_passed_again_until_they_come(monkeypatch):
    """A pass that moves nothing scans every member: with both ranks waiting on each other every step, neither
    looks at its members again before the other's frame came (rank 0 waits for b.x and the decisions after
    running a, rank 1 for a.y after ending its iteration)."""
    from walkserve.worker.cohort import Cohort

    idle: dict[int, int] = defaultdict(int)
    original = Cohort.advance

    def advance(cohort):
        moved = original(cohort)
        idle[cohort.fx.rank] += not moved
        return moved

    monkeypatch.setattr(Cohort, "advance", advance)
    got, expected = _run(_WireSim({"a": 0, "b": 1}))
    assert got == expected
    assert idle[0] <= 2 and idle[1] <= 2, dict(idle)  # the start and the end at most, not one per step


class _HandOffSim(_WireSim):
    """Records each mid-pass hand-off: the sending rank, the kinds of message in it, and the iteration its
    members are at as it leaves."""

    def __init__(self, ranks: dict[str, int]):
        super().__init__(ranks)
        self.hand_offs: list[tuple[int, set[str], set[int]]] = []

    def handed_off(self, rank: int, messages: list) -> None:
        ks = {mb.k for run in self._runs(rank) for mb in run.members.values() if mb.local.level.depth}  # the loop's
        self.hand_offs.append((rank, {type(msg).__name__ for _, msg in messages}, ks))
        super().handed_off(rank, messages)

    def _runs(self, rank: int) -> list:
        return [run for req in self.executors[rank].requests.values() for run in req.walks.values()]


def test_the_deciding_rank_hands_its_step_off_before_setting_up_the_next_iteration():
    """Rank 1 runs b and decides: b's carry and the decisions leave in one frame mid-pass, while its members are
    still at the iteration that was decided, so rank 0 can start the next step as rank 1 goes on."""
    sim = _HandOffSim({"a": 0, "b": 1})
    got, expected = _run(sim)
    assert got == expected
    from_1 = [(kinds, ks) for rank, kinds, ks in sim.hand_offs if rank == 1]
    assert len(from_1) == STEPS  # the last one too: its decision ends the loop
    for step, (kinds, ks) in enumerate(from_1):
        assert kinds == {"Values", "LoopEvents"}
        assert ks == {step}  # not yet moved on to step + 1
    assert all(rank == 1 for rank, _, _ in sim.hand_offs)  # rank 0 waits for decisions: nothing to hand off early


def test_rows_taken_early_leave_before_those_put_later_and_the_rest_waits():
    from walkserve.worker.outgoing import CONDUCTOR, Outgoing, to_rank

    out = Outgoing()
    out.value(1, "w", "a", "y", "r1", (0,), 10)
    out.client("w", "b", "x", "text", "r1", (0,), 11)
    out.to(1, "moved state")
    out.loop(1, "w", "loop", "r1", (), 0, -1)
    assert out.rows_for_ranks
    early = out.take_ranks()
    assert [(dest, type(msg).__name__) for dest, msg in early] == [(to_rank(1), "Values"), (to_rank(1), "LoopEvents")]
    assert not out.rows_for_ranks and out
    out.value(1, "w", "a", "y", "r1", (1,), 12)
    rest = out.take()
    assert [(dest, type(msg).__name__ if not isinstance(msg, str) else msg) for dest, msg in rest] == [
        (CONDUCTOR, "ClientOuts"), (to_rank(1), "Values"), (to_rank(1), "moved state")]
    assert rest[1][1].paths == [(1,)] and not out
