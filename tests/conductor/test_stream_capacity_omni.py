"""The capacity model on a Qwen3-Omni-like cost table: the speech rank's nested loop, priced node by node.

Per second of audio a stream needs 12.5 talker frames; each frame is one
talker step, one code-predictor step, 14 code-predictor-step steps (the depth
loop) and the three glue nodes; Code2Wav decodes one 25-frame chunk per 2 s
and does not batch (its step time grows with its batch). Step times are
lines ``a + c * b`` (seconds), as the tiny weights measure them on a CPU: a
fixed cost per step and little per member. The estimate must be the largest b
whose busy time ``sum(k * t(b))`` stays within the headroom, computed here
from the table, whatever mix of batch sizes the reports saw.
"""

from __future__ import annotations

import copy

import pytest

from walkserve.conductor.capacity import EXTRAPOLATE, StreamCapacity
from walkserve.worker.step_costs import bucket

FRAMES_PER_S = 12.5
# node -> (rank, items per second of audio per stream, step seconds at batch 0, seconds per member)
TABLE = {
    "thinker": (0, 3.0, 0.006, 0.0005),
    "talker": (1, FRAMES_PER_S, 0.0035, 0.0001),
    "code_predictor": (1, FRAMES_PER_S, 0.0025, 0.00005),
    "code_predictor_step": (1, 14 * FRAMES_PER_S, 0.0016, 0.00003),
    "predictor_in": (1, FRAMES_PER_S, 0.0001, 0.00002),
    "frame": (1, FRAMES_PER_S, 0.0001, 0.00002),
    "talker_in": (1, FRAMES_PER_S, 0.0001, 0.00002),
    "code2wav": (1, 1 / (25 / FRAMES_PER_S), 0.0, 0.035),
}
HEADROOM = 0.8


def step(node: str, b: float) -> float:
    _, _, a, c = TABLE[node]
    return a + c * b


def table_capacity(trusted: float = float("inf"), overhead: float = 1.0) -> int:
    """The largest b with every rank's overhead * sum(k * t(b)) <= HEADROOM; past ``trusted`` a step costs
    t(trusted) * b / trusted."""
    def t(node: str, b: int) -> float:
        return step(node, b) if b <= trusted else step(node, trusted) * b / trusted

    def load(b: int) -> float:
        ranks: dict[int, float] = {}
        for node, (rank, per_s, _, _) in TABLE.items():
            ranks[rank] = ranks.get(rank, 0.0) + per_s * t(node, b)
        return overhead * max(ranks.values())

    b = 1
    while load(b + 1) <= HEADROOM:
        b += 1
    return b


class SpeechRanks:
    """Cumulative step counters per node and batch bucket, as the two ranks report them."""

    def __init__(self, model: StreamCapacity, overhead: float | None = None):
        self.model, self.overhead = model, overhead  # the ranks' loop time per engine second (None: not reported)
        self.counts: dict[int, dict[str, dict[int, list[float]]]] = {0: {}, 1: {}}
        self.active = {0: 30.0, 1: 30.0}  # start-up: loading weights before the first report

    def report(self, streams: int, mix: dict[int, float], audio_s: float = 0.5) -> None:
        """``streams`` streams made ``audio_s`` seconds of audio each; ``mix``: batch -> share of each node's
        members that ran at that batch (streams at different phases step in different cohorts)."""
        for node, (rank, per_s, _, _) in TABLE.items():
            members = per_s * audio_s * streams
            for b, share in mix.items():
                c = self.counts[rank].setdefault(node, {}).setdefault(bucket(b), [0.0, 0.0, 0.0])
                steps = members * share / b
                c[0] += steps
                c[1] += steps * b
                c[2] += steps * step(node, b)
                self.active[rank] += steps * step(node, b) * (self.overhead or 1.0)
        self.model.add_audio(audio_s * streams)
        for rank, counts in self.counts.items():
            self.model.observe(rank, copy.deepcopy(counts), None if self.overhead is None else self.active[rank])


def test_the_estimate_is_the_cost_tables_capacity():
    model = StreamCapacity(HEADROOM)
    ranks = SpeechRanks(model)
    for b in (2, 4, 8, 12):  # two cohorts out of phase: half the members at b, half at b / 2
        ranks.report(b, {b: 0.5, b // 2: 0.5})
    # the speech rank: 0.35875 + 0.025375 b <= 0.8 -> b <= 17.39 (12 measured: the line holds to 24)
    assert model.capacity() == table_capacity() == 17
    assert model.load(17) == pytest.approx(0.35875 + 0.025375 * 17, rel=1e-6)


def test_reports_at_one_load_with_streams_at_every_phase_still_show_how_a_step_grows_with_its_batch():
    """Every report alike (a quarter of the members stepping alone: streams starting, ending), so one mean
    per report would never move: the points per batch bucket still give the line."""
    model = StreamCapacity(HEADROOM)
    ranks = SpeechRanks(model)
    for _ in range(6):
        ranks.report(8, {1: 0.25, 8: 0.75})
    trusted = EXTRAPOLATE * 8  # batch 8 measured: the line is trusted to 16, each member costs the same past it
    assert model.capacity() == table_capacity(trusted) == 16


def test_one_batch_size_seen_prices_every_member_alike():
    model = StreamCapacity(HEADROOM)
    ranks = SpeechRanks(model)
    for _ in range(3):
        ranks.report(1, {1: 1.0})
    # the proportional prior from batch 1: the speech rank's 0.384125 s per stream -> 2 streams
    assert model.capacity() == 2 and model.load(1) == pytest.approx(0.384125, rel=1e-6)


def test_the_ranks_work_between_engine_calls_counts_too():
    """A rank that spends half again its engine time routing and building steps is that much busier; the
    start-up before its first report is no part of it."""
    model = StreamCapacity(HEADROOM)
    ranks = SpeechRanks(model, overhead=1.5)
    for b in (2, 4, 8, 12):
        ranks.report(b, {b: 0.5, b // 2: 0.5})
    assert model.overhead(1) == pytest.approx(1.5) and model.overhead(0) == pytest.approx(1.5)
    # 1.5 * (0.35875 + 0.025375 b) <= 0.8 -> b <= 6.88
    assert model.capacity() == table_capacity(overhead=1.5) == 6
