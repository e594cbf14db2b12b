"""Which ready members a step takes when streams compete: least playback slack first (earliest deadline first).

The big idea: a streamed request's audio plays in real time from its first
chunk on, so each of its next chunks has a deadline, and every node on the
path to the audio (LM decode, talker, codec) can tell from its own firings how
much audio the client already has (``graph.playback.Playback``)::

    start      the moment this rank completed the request's first chunk (its playback clock),
               moved on by a gap's lateness when the emitting node is here (the client waited)
    deadline   start + startup_s + audio_after(firings done)   (the client runs dry then)
    slack      deadline - now - (firings to the next chunk x this node's step cost
                                 + one step of each playback node after it)

A node of the walk with no declared playback takes the request's latest slack
from one that has, so deadlines travel with the work along the whole path.
When a node unit has more ready members than one step takes (the engine's
``step_capacity``), the step takes them in this order, and the rest wait for
the next pass::

    URGENT   streams about to gap (slack < urgent_slack_s), and deadline-free work
             that waited longer than aging_s (nothing starves): least slack first
    FIRST    streams before their first chunk (time to first audio): oldest first
    STREAM   streams with slack to spare: least slack first
    FREE     work with no deadline (non-streamed requests, text): longest waiting first

Pacing: when the ready members are more than one step takes, a stream with
slack above ``pace_slack_s`` waits while other work is ready on this rank (in
this pass or the one before), so its place goes to the streams that need it;
with room in the step, or nothing else waiting, it runs (holding it back then
would only shrink the audio its client has buffered against a late step). ``fifo`` mode
keeps the former order (every ready member, as they came) and only measures.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

from walkserve.core.scheduling import StreamScheduling
from walkserve.graph.playback import Playback
from walkserve.protocol.rank_stats import SLACK_EDGES_S
from walkserve.worker.program import NodeProgram
from walkserve.worker.state import Member
from walkserve.worker.step_costs import StepCosts


class Tier(IntEnum):
    URGENT = 0
    FIRST = 1
    STREAM = 2
    FREE = 3


class Priority(NamedTuple):
    tier: Tier
    key: float  # within a tier, lower goes first
    slack: float | None  # a stream's slack (None: no playback clock yet, or no deadline)
    paced: bool  # far ahead of playback: may wait


@dataclass
class StreamClock:
    """One request's playback on this rank (times on the scheduler's clock)."""

    seen: float  # when this rank first saw it ready
    last_ran: float  # when a firing of it last ran here
    start: float | None = None  # its first chunk completed here (the playback clock runs)
    runs_dry: float | None = None  # when the client's audio runs out (the emitting node is here)
    slack: float | None = None  # its latest slack, for nodes of the walk without playback


class Deadlines:
    def __init__(self, config: StreamScheduling, costs: StepCosts, now: Callable[[], float]):
        self.config, self.costs, self.now = config, costs, now
        self.clocks: dict[str, StreamClock] = {}
        self.waiting = self.waited = 0  # members ready and not paced: this pass, the pass before
        self.slack_counts: dict[str, list[int]] = {}  # node -> members dispatched per slack bucket
        self.counts = {"held_paced": 0, "held_capacity": 0, "gaps": 0}
        self.gap_s = 0.0

    def new_pass(self) -> None:
        self.waited, self.waiting = self.waiting, 0

    # ---- picking -------------------------------------------------------------------------------
    def pick(self, node: NodeProgram, ready: list[Member], capacity: int | None) -> tuple[list[Member], list[Member]]:
        """(the members this step takes, those that wait for a later pass)."""
        return self.pick_across([node] * len(ready), ready, capacity)

    def pick_across(self, nodes: list[NodeProgram], ready: list[Member],
                    capacity: int | None) -> tuple[list[Member], list[Member]]:
        """``pick`` for one engine call whose members come from several units (a gathering engine's call over
        every cohort): member i is at ``nodes[i]``; ``capacity`` bounds them all together."""
        cap = capacity or len(ready)
        if len(ready) <= cap and not any(m.run.streamed for m in ready):  # no deadline, and it all fits
            self.waiting += len(ready)
            return ready, []
        now, batch = self.now(), min(len(ready), cap)
        prios = [self.priority(n, m, batch, now) for n, m in zip(nodes, ready)]
        if not self.config.by_deadline:
            self._dispatched(nodes, prios)
            return ready, []
        needy = sum(1 for p in prios if not p.paced)
        self.waiting += needy
        # streams far ahead wait only for a place in a full step that work in need takes: with room for all, a
        # batched step costs about the same, and holding them back only shrinks the audio the client has buffered
        pace = len(ready) > cap and (needy > 0 or self.waited > 0)
        order = sorted(range(len(ready)), key=lambda i: (prios[i].tier, prios[i].key))
        take = [i for i in order if not (pace and prios[i].paced)][:cap]
        chosen = set(take)
        held_paced = sum(1 for i in order if i not in chosen and pace and prios[i].paced)
        self.counts["held_paced"] += held_paced
        self.counts["held_capacity"] += len(ready) - len(take) - held_paced
        self._dispatched([nodes[i] for i in take], [prios[i] for i in take])
        return [ready[i] for i in take], [ready[i] for i in order if i not in chosen]

    def priority(self, node: NodeProgram, m: Member, batch: int, now: float) -> Priority:
        clock = self._clock(m, now)
        if not m.run.streamed:
            slack = self.config.aging_s - (now - clock.last_ran)  # against the aging bound
            return Priority(Tier.URGENT if slack < 0 else Tier.FREE, slack, None, False)
        if clock.start is None:
            return Priority(Tier.FIRST, clock.seen, None, False)
        if node.playback is not None:
            clock.slack = self._slack(node, node.playback, m.k, clock.start, batch, now)
        slack = clock.slack if clock.slack is not None else math.inf
        tier = Tier.URGENT if slack < self.config.urgent_slack_s else Tier.STREAM
        return Priority(tier, slack, clock.slack, clock.slack is not None and slack > self.config.pace_slack_s)

    def _slack(self, node: NodeProgram, p: Playback, fired: int, start: float, batch: int, now: float) -> float:
        deadline = start + self.config.startup_s + p.audio_after(fired)
        costs = self.costs
        produce = p.to_next_chunk(fired) * costs.estimate(node.name, batch)
        produce += sum(costs.estimate(after, batch) for after in node.downstream)
        return deadline - now - produce

    def _clock(self, m: Member, now: float) -> StreamClock:
        clock = self.clocks.get(m.rid)
        if clock is None:
            clock = self.clocks[m.rid] = StreamClock(now, now)
        return clock

    def _dispatched(self, nodes: list[NodeProgram], prios: list[Priority]) -> None:
        for node, p in zip(nodes, prios):
            if p.slack is not None:
                counts = self.slack_counts.get(node.name)
                if counts is None:
                    counts = self.slack_counts[node.name] = [0] * (len(SLACK_EDGES_S) + 1)
                counts[slack_bucket(p.slack)] += 1

    # ---- after a step --------------------------------------------------------------------------
    def ran(self, node: NodeProgram, members: list[Member]) -> None:
        """``node`` ran for ``members`` (their iteration ``k``): clocks start, the emitter counts gaps."""
        now, p = self.now(), node.playback
        for m in members:
            clock = self.clocks.get(m.rid)
            if clock is None:
                continue
            clock.last_ran = now
            if p is None or not m.run.streamed:
                continue
            fired = m.k + 1
            if clock.start is None and p.chunks(fired):
                clock.start = now
            if not node.downstream:
                self._heard(clock, p, m.k, now)

    def _heard(self, clock: StreamClock, p: Playback, k: int, now: float) -> None:
        """The emitting node completed firing ``k``: its chunk is a gap if the client's audio ran out before it.
        The client plays on from the late chunk, so the stream's deadlines move by the lateness too."""
        duration = p.audio_after(k + 1) - p.audio_after(k)
        if duration <= 0:
            return
        if clock.runs_dry is None:
            clock.runs_dry = now + self.config.startup_s + duration
            return
        late = now - clock.runs_dry
        if late <= 0:
            clock.runs_dry += duration
            return
        self.counts["gaps"] += 1
        self.gap_s += late
        clock.runs_dry = now + duration
        if clock.start is not None:
            clock.start += late

    def forget(self, rid: str) -> None:
        self.clocks.pop(rid, None)

    def streams(self) -> int:
        """Requests whose playback clock runs here."""
        return sum(1 for c in self.clocks.values() if c.start is not None)


def slack_bucket(slack: float) -> int:
    """The index of the first edge of ``SLACK_EDGES_S`` at or above ``slack`` (the last bucket: above all)."""
    for i, edge in enumerate(SLACK_EDGES_S):
        if slack <= edge:
            return i
    return len(SLACK_EDGES_S)
