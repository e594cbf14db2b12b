"""Deadlines travel with the work: the Orpheus decode walk split over two ranks, on virtual clocks.

Rank 0 runs the LM, rank 1 the codec (``orpheus-split``); each rank has its
own executor, its own deadline scheduler and its own virtual clock (they run
at once, as two processes do), and the LM's tokens reach the codec's rank as
messages stamped with the sender's time. The codec is the bottleneck here: it
decodes at most 4 windows per forward and each window costs 3 ms, so the
codec rank must choose whose windows go first. Only that rank's own firings
tell it where each stream's playback is (``Playback`` of the codec node), so
if deadline scheduling keeps a burst playing here, the downstream rank orders
by slack too. A client model independent of the scheduler plays each stream's
chunks as they leave rank 1 and counts the gaps.
"""

from __future__ import annotations

import heapq
import itertools

import torch

from tests.worker.test_stream_scheduling import LM, Codec
from tests.worker.virtual_clock import PASS_S, Clock, gaps
from walkserve.core.sampling import SamplingParams
from walkserve.core.scheduling import DEADLINE, FIFO, StreamScheduling
from walkserve.engines.values import concat
from walkserve.models.orpheus.graph import build_graph
from walkserve.models.orpheus.processor import SpeechParams
from walkserve.models.orpheus.tokens import AUDIO_CODE_BASE, SAMPLE_RATE
from walkserve.protocol import messages as m
from walkserve.testing.simulator import placement_of
from walkserve.worker.executor import Executor
from walkserve.worker.outgoing import CONDUCTOR

HOP_S = 0.0005  # a message from one rank to the other
RANKS = {"lm": 0, "codec": 1}
LM_COST = (0.004, 0.0001, 32)  # fixed, per member, members per forward: room for every stream (7 steps a frame)
CODEC_COST = (0.004, 0.003, 4)  # 4 windows per forward: 4 ms per window, ~21 streams in real time
# four long streams play from t=0 and, made at about 2.7x real time, get seconds ahead of playback; at 2 s a
# burst of twenty short ones arrives: twenty-four in lockstep need 96 ms of codec per 85 ms frame (slower than
# real time), the twenty alone do not, and the four have seconds of audio buffered at the client
BURST = [(0.0, f"early{i}", 1000) for i in range(4)] + [(2.0, f"burst{i}", 120) for i in range(20)]


class SplitRun:
    """Two executors, one per rank, stepped in time order: a rank with work runs at its own clock; a message
    reaches the other rank at the sender's clock plus ``HOP_S`` (an idle rank waits for it)."""

    def __init__(self, mode: str, **knobs):
        graph = build_graph()
        placement = placement_of(graph, lambda walk, node: RANKS[node])
        self.clocks = {0: Clock(), 1: Clock()}
        engines = {0: {"lm": LM("lm", self.clocks[0], *LM_COST)}, 1: {"codec": Codec("codec", self.clocks[1], *CODEC_COST)}}
        self.ranks = {r: Executor(r, graph, engines[r], concat, placement, clock=self.clocks[r],
                                  scheduling=StreamScheduling(mode=mode, **knobs)) for r in (0, 1)}
        self.busy = {0: False, 1: False}
        self.inbox: list[tuple[float, int, int, object]] = []  # (arrival, seq, rank, message)
        self.seq = itertools.count()
        self.audio: dict[str, list[tuple[float, float]]] = {}

    def start(self, at: float, rid: str, tokens: int) -> None:
        self.audio[rid] = []
        msg = m.StartWalk(rid, "decode", dict(RANKS), {"last": torch.tensor([AUDIO_CODE_BASE])}, SpeechParams(),
                          SamplingParams(max_tokens=tokens))
        for rank in (0, 1):
            heapq.heappush(self.inbox, (at, next(self.seq), rank, msg))

    def run(self) -> SplitRun:
        for _ in range(400_000):
            working = [(self.clocks[r].t, r) for r in (0, 1) if self.busy[r]]
            step_at = min(working, default=None)
            if self.inbox and (step_at is None or self.inbox[0][0] <= step_at[0]):
                self.deliver(*heapq.heappop(self.inbox))
            elif step_at is not None:
                self.step(step_at[1])
            else:
                return self
        raise AssertionError("the run did not settle")

    def deliver(self, at: float, _: int, rank: int, msg) -> None:
        clock = self.clocks[rank]
        clock.t = max(clock.t, at)  # an idle rank waited for it; a busy one takes it at its next pass
        self.ranks[rank].receive(msg)
        self.busy[rank] = True

    def step(self, rank: int) -> None:
        ex, clock = self.ranks[rank], self.clocks[rank]
        moved = ex.advance()
        for dest, msg in ex.out.take():
            if dest != CONDUCTOR:
                heapq.heappush(self.inbox, (clock.t + HOP_S, next(self.seq), dest[1], msg))
            elif isinstance(msg, m.ClientOuts) and msg.modality == "audio":
                for rid, value in zip(msg.request_ids, msg.values, strict=True):
                    self.audio[rid].append((clock.t, value.numel() / SAMPLE_RATE))
        self.busy[rank] = moved or bool(ex.dirty)
        if self.busy[rank]:
            clock.t += PASS_S


def split_run(mode: str, arrivals=BURST, **knobs) -> SplitRun:
    run = SplitRun(mode, **knobs)
    for at, rid, tokens in arrivals:
        run.start(at, rid, tokens)
    return run.run()


def test_the_codec_rank_orders_by_slack_so_a_burst_plays_where_fifo_gaps():
    fifo, deadline = split_run(FIFO, pace_slack_s=0.5), split_run(DEADLINE, pace_slack_s=0.5)
    played = {rid: sum(s for _, s in chunks) for rid, chunks in fifo.audio.items()}
    # nothing starves: every stream plays to its end both ways
    assert played == {rid: sum(s for _, s in chunks) for rid, chunks in deadline.audio.items()}
    assert min(played.values()) > 1.3
    fifo_gaps = {rid: gaps(c) for rid, c in fifo.audio.items()}
    deadline_gaps = {rid: gaps(c) for rid, c in deadline.audio.items()}
    assert sum(fifo_gaps[f"burst{i}"] > 0 for i in range(20)) >= 10, fifo_gaps  # lockstep at the codec gaps
    assert sum(deadline_gaps.values()) == 0, deadline_gaps
    codec_rank, lm_rank = deadline.ranks[1].stats(), deadline.ranks[0].stats()
    # the choice was made downstream: the codec's steps were full, streams far ahead waited there
    assert codec_rank.scheduling["held_capacity"] > 0 and codec_rank.scheduling["held_paced"] > 0
    assert max(deadline.ranks[1].engines["codec"].batches) == CODEC_COST[2]  # capped at the engine's batch
    assert sum(codec_rank.slack["codec"]) > 0 and "lm" not in codec_rank.slack
    # the LM's rank had room for everyone: it held nothing back, and every gap the modelled client
    # heard would have been counted by the codec's rank, the one that emits the audio
    assert lm_rank.scheduling["held_capacity"] == lm_rank.scheduling["held_paced"] == 0
    assert codec_rank.scheduling["gaps"] == 0 and fifo.ranks[1].stats().scheduling["gaps"] > 0


def test_first_chunks_go_before_streams_with_slack_on_the_codec_rank():
    """From the burst's first chunk to its last, the codec rank spends no step on the early streams (seconds
    of audio buffered): first chunks, and streams about to gap, go first; the early streams wait (pacing)."""
    run = split_run(DEADLINE, pace_slack_s=0.5)
    firsts = sorted(run.audio[f"burst{i}"][0][0] for i in range(20))
    assert firsts[-1] - firsts[0] > 0.1  # 4 windows a step: the first chunks took several steps
    early = [t for i in range(4) for t, _ in run.audio[f"early{i}"]]
    assert any(t < firsts[0] for t in early) and any(t > firsts[-1] for t in early)
    assert not [t for t in early if firsts[0] <= t <= firsts[-1]]
