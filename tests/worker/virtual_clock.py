"""A rank's executor driven on a virtual clock: engines that cost fixed virtual time, a client that hears gaps.

Shared by the scheduling tests in this folder. Nothing here sleeps: an engine
call advances the clock by its cost, the heartbeat's own pass by ``PASS_S``,
and an idle rank jumps to the next arrival, so every run is deterministic.
"""

from __future__ import annotations

from walkserve.engines.base import Engine, Group
from walkserve.protocol import messages as m
from walkserve.worker.executor import Executor

PASS_S = 0.0005  # the heartbeat's own time per pass


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class TimedEngine(Engine):
    """Costs ``fixed + per_member * members`` virtual seconds per call; ``step_capacity`` members a step."""

    def __init__(self, component: str, clock: Clock, fixed: float, per_member: float, capacity: int | None):
        self.component, self.clock = component, clock
        self.fixed, self.per_member, self.capacity = fixed, per_member, capacity
        self.batches: list[int] = []

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list[list]:
        n = sum(len(g.request_ids) for g in groups)
        self.batches.append(n)
        forwards = -(-n // self.capacity) if self.capacity else 1  # more than a batch: more forwards
        self.clock.t += self.fixed * forwards + self.per_member * n
        return [[self.answer(g, i) for i in range(len(g.request_ids))] for g in groups]

    def answer(self, group: Group, i: int) -> dict:
        raise NotImplementedError

    def step_capacity(self) -> int | None:
        return self.capacity

    def release(self, request_id: str) -> None:
        pass


def drive(ex: Executor, clock: Clock, starts: list[tuple[float, m.StartWalk]], rate: int,
          stall: tuple[float, float] | None = None, passes: int = 400_000) -> dict[str, list[tuple[float, float]]]:
    """Runs ``ex`` until it settles, starting each walk at its time: every request's client chunks as (arrival,
    seconds at ``rate`` samples a second). ``stall``: (at, seconds): once the clock passes ``at`` the rank stops
    for ``seconds`` (descheduled on a busy machine)."""
    pending = sorted(starts, key=lambda start: start[0])
    chunks: dict[str, list[tuple[float, float]]] = {start.request_id: [] for _, start in pending}
    for _ in range(passes):
        while pending and pending[0][0] <= clock.t:
            ex.receive(pending.pop(0)[1])
        moved = ex.advance()
        if stall and clock.t >= stall[0]:
            clock.t, stall = clock.t + stall[1], None
        for _, msg in ex.out.take():
            if isinstance(msg, m.ClientOuts):
                for rid, value in zip(msg.request_ids, msg.values, strict=True):
                    chunks[rid].append((clock.t, value.numel() / rate))
        if moved or ex.dirty:
            clock.t += PASS_S
        elif pending:
            clock.t = pending[0][0]
        else:
            return chunks
    raise AssertionError("the run did not settle")


def gaps(chunks: list[tuple[float, float]]) -> int:
    """Chunks that arrived after the audio before them ran out (the player waits, then plays on)."""
    count, runs_dry = 0, None
    for at, seconds in chunks:
        if runs_dry is not None and at > runs_dry:
            count += 1
        runs_dry = max(at, runs_dry or at) + seconds
    return count
