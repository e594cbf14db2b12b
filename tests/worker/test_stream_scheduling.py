"""Streams under contention, on a virtual clock: deadline scheduling keeps a burst's streams playing where fifo gaps.

One rank runs the Orpheus decode walk (LM loop streaming into the codec) for
many requests, in process. The engines cost fixed virtual time per call (a
fixed part plus a part per member, the LM capped at its batch), so the run is
deterministic. A client model, independent of the scheduler, plays each
stream's audio chunks as they leave the rank (by their sample counts at
24 kHz) and counts a gap whenever a chunk arrives after the audio before it
ran out; the player then plays on from the late chunk.
"""

from __future__ import annotations

import torch

from tests.worker.virtual_clock import Clock, TimedEngine, drive, gaps
from walkserve.core.sampling import SamplingParams
from walkserve.core.scheduling import DEADLINE, FIFO, StreamScheduling
from walkserve.engines.base import Group
from walkserve.engines.values import concat
from walkserve.models.orpheus.graph import build_graph
from walkserve.models.orpheus.processor import SpeechParams
from walkserve.models.orpheus.tokens import AUDIO_CODE_BASE, FRAME_SAMPLES, SAMPLE_RATE
from walkserve.protocol import messages as m
from walkserve.worker.executor import Executor


class LM(TimedEngine):
    def answer(self, group: Group, i: int) -> dict:
        return {"token": torch.tensor([AUDIO_CODE_BASE + 1])}  # never END_OF_SPEECH: runs to max_tokens


class Codec(TimedEngine):
    gathers = True

    def answer(self, group: Group, i: int) -> dict:
        span = group.spans[i]["codes"]
        frames = 2 if span.index == 0 else 1  # window 0 emits two frames, each later window one
        return {"audio": torch.zeros(frames * FRAME_SAMPLES)}


def run(mode: str, arrivals: list[tuple[float, str, int]], lm=(0.002, 0.001, 16), codec=(0.001, 0.0005, None),
        stall: tuple[float, float] | None = None, batched: bool = True, **knobs) -> tuple[dict[str, list[tuple[float, float]]], Executor]:
    """Every stream's audio chunks as (arrival time, seconds), and the executor (for its stats). ``stall``:
    (at, seconds): once the clock passes ``at`` the rank stops for ``seconds`` (descheduled on a busy machine).
    ``batched`` False: one cohort per request (loop cohorts off), so the codec's call gathers several cohorts."""
    clock = Clock()
    engines = {"lm": LM("lm", clock, *lm), "codec": Codec("codec", clock, *codec)}
    ex = Executor(0, build_graph(), engines, concat, scheduling=StreamScheduling(mode=mode, **knobs), clock=clock,
                  batched=batched)
    starts = [(at, m.StartWalk(rid, "decode", {"lm": 0, "codec": 0}, {"last": torch.tensor([AUDIO_CODE_BASE])},
                               SpeechParams(), SamplingParams(max_tokens=tokens))) for at, rid, tokens in arrivals]
    return drive(ex, clock, starts, SAMPLE_RATE, stall), ex


# four long streams play from t=0 and get ahead of playback; at 2 s a burst of ten short ones arrives. The LM
# steps at most 8 members per forward (2 ms + 1 ms per member): fourteen in lockstep are slower than real time,
# the ten alone are not, and the four have seconds of audio buffered at the client.
BURST = [(0.0, f"early{i}", 500) for i in range(4)] + [(2.0, f"burst{i}", 120) for i in range(10)]
LM_COST = (0.002, 0.001, 8)


def test_deadline_scheduling_keeps_a_burst_playing_where_fifo_gaps():
    fifo_audio, _ = run(FIFO, BURST, lm=LM_COST, pace_slack_s=0.5)
    deadline_audio, ex = run(DEADLINE, BURST, lm=LM_COST, pace_slack_s=0.5)
    played = {rid: sum(s for _, s in chunks) for rid, chunks in fifo_audio.items()}
    assert played == {rid: sum(s for _, s in chunks) for rid, chunks in deadline_audio.items()}  # to the end both ways
    assert min(played.values()) > 1.3
    fifo_gaps = {rid: gaps(c) for rid, c in fifo_audio.items()}
    deadline_gaps = {rid: gaps(c) for rid, c in deadline_audio.items()}
    assert all(fifo_gaps[f"burst{i}"] > 0 for i in range(10)), fifo_gaps  # lockstep: every burst stream gaps
    assert sum(deadline_gaps.values()) == 0, deadline_gaps  # the early streams wait on their buffer instead
    stats = ex.stats()
    assert stats.stream_scheduling == DEADLINE
    assert stats.scheduling["held_paced"] > 0 and stats.scheduling["held_capacity"] > 0
    assert stats.step_costs["lm"][8] > stats.step_costs["lm"][4]  # measured on the virtual clock
    assert sum(stats.slack["lm"]) > 0 and sum(stats.slack["codec"]) > 0
    assert stats.scheduling["gaps"] == 0


def test_the_rank_counts_the_gaps_the_client_hears():
    audio, ex = run(FIFO, BURST, lm=LM_COST)
    stats = ex.stats()
    assert stats.scheduling["gaps"] == sum(gaps(c) for c in audio.values()) > 0
    assert stats.scheduling["held_paced"] == stats.scheduling["held_capacity"] == 0  # fifo holds nothing back


# two long streams and, while they play, a short one arriving every 0.2 s: at most four at once, well within the
# rank's capacity (the LM step has room for all of them), so nothing competes for a step. The rank stalls for
# 1.5 s at 3 s (descheduled on a busy machine): the audio a stream had buffered at the client carries it over.
CALM = [(0.0, "long0", 1000), (0.05, "long1", 1000)] + [(0.1 + 0.2 * i, f"short{i}", 60) for i in range(30)]
CALM_LM = (0.002, 0.0002, 16)


def test_deadline_scheduling_does_not_pace_streams_when_the_step_has_room():
    """Pacing holds a stream far ahead of playback only to give its place in a full step to one that needs it.
    Before, it held a stream whenever another was ready (every new stream before its first chunk is), so under
    a steady trickle of arrivals each long stream's lead stayed near ``pace_slack_s`` and the stall gapped them,
    where fifo's had seconds of audio buffered."""
    fifo_audio, _ = run(FIFO, CALM, lm=CALM_LM, stall=(3.0, 1.5))
    deadline_audio, ex = run(DEADLINE, CALM, lm=CALM_LM, stall=(3.0, 1.5))
    fifo_gaps = {rid: gaps(c) for rid, c in fifo_audio.items()}
    deadline_gaps = {rid: gaps(c) for rid, c in deadline_audio.items()}
    assert fifo_gaps["long0"] == fifo_gaps["long1"] == 0
    assert deadline_gaps["long0"] == deadline_gaps["long1"] == 0, deadline_gaps
    assert sum(deadline_gaps.values()) <= sum(fifo_gaps.values()), (deadline_gaps, fifo_gaps)
    assert ex.stats().scheduling["held_paced"] == ex.stats().scheduling["held_capacity"] == 0


class SpyCodec(Codec):
    """Records, per call, the priorities of the members it got and of those its call had no room for."""

    executor: Executor

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list[list]:
        ex, now = self.executor, self.clock()
        taken = {rid for g in groups for rid in g.request_ids}
        prio = {}
        for cohort in ex.cohorts.by_key.values():
            for i, unit in enumerate(cohort.units):
                if getattr(unit, "node", None) is not None and unit.node.name == "codec":
                    for mb in cohort.buckets[i]:
                        if mb.rid in taken or mb.phase.name == "RUNNING":  # in this call, or deferred from it
                            p = ex.deadlines.priority(unit.node, mb, len(taken), now)
                            prio[mb.rid] = (p.tier, p.key)
        self.calls.append(([prio[r] for r in taken if r in prio], [p for r, p in prio.items() if r not in taken]))
        return super().run_groups(groups, may_yield)


def gathered_run(capacity: int | None) -> tuple[dict[str, int], SpyCodec, Executor]:
    """Ten streams of different lengths, one cohort each (loop cohorts off), the LM cheap: every stream's audio
    samples, the codec and the executor."""
    clock = Clock()
    codec = SpyCodec("codec", clock, 0.001, 0.0005, capacity)
    codec.calls = []
    engines = {"lm": LM("lm", clock, 0.0002, 0.0001, 16), "codec": codec}
    ex = codec.executor = Executor(0, build_graph(), engines, concat, scheduling=StreamScheduling(pace_slack_s=0.5),
                                   clock=clock, batched=False)
    starts = [(0.0, m.StartWalk(f"s{i}", "decode", {"lm": 0, "codec": 0}, {"last": torch.tensor([AUDIO_CODE_BASE])},
                                SpeechParams(), SamplingParams(max_tokens=100 + 10 * i))) for i in range(10)]
    chunks = drive(ex, clock, starts, SAMPLE_RATE)
    return {rid: round(sum(s for _, s in c) * SAMPLE_RATE) for rid, c in chunks.items()}, codec, ex


def test_a_gathering_engines_batch_bounds_its_call_over_every_cohort_least_slack_first():
    """With one cohort per request, each cohort's share of the codec's gathered call was bounded by its batch,
    not the call: one call took every stream's window (10 at once, with a batch of 3). Now the call takes
    at most 3, chosen across the cohorts by least slack, and the rest run in the next steps."""
    unbounded, _, _ = gathered_run(None)
    audio, codec, ex = gathered_run(3)
    assert max(codec.batches) == 3, codec.batches
    assert audio == unbounded and min(audio.values()) > 0  # every stream's audio came out, all of it
    deferred = [(took, left) for took, left in codec.calls if left]
    assert deferred  # some calls had more windows ready than their batch
    for took, left in deferred:
        assert max(took) <= min(left), (took, left)  # across cohorts, least slack (first chunks) first
    assert ex.stats().scheduling["held_capacity"] > 0
