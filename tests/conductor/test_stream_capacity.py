"""The real-time capacity model and stream admission on fixed step costs and a virtual clock."""

from __future__ import annotations

import copy
import math

import pytest

from walkserve.conductor.capacity import EXPLORE_LOAD, StreamCapacity
from walkserve.conductor.stream_admission import RECOVER_S, StreamAdmission
from walkserve.conductor.stream_desk import audio_samples
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.protocol import messages as m
from walkserve.worker.step_costs import bucket

# An Orpheus-like graph on two ranks: the LM on rank 0 (82 steps per second of audio, one token per step for
# every stream of the batch), the codec on rank 1 (11.7 windows per second of audio).
LM_PER_AUDIO_S, CODEC_PER_AUDIO_S = 82.0, 11.7


def lm_step(b: float) -> float:
    return 0.002 + 0.001 * b


def codec_step(b: float) -> float:
    return 0.005 + 0.002 * b


class Ranks:
    """Cumulative counters as two ranks report them, for b streams producing ``audio_s`` seconds each round."""

    def __init__(self, model: StreamCapacity):
        self.model = model
        self.nodes: dict[int, dict[str, dict[int, list[float]]]] = {0: {"lm": {}}, 1: {"codec": {}}}

    def run(self, batch: int, audio_s: float) -> None:
        for rank, node, per_s, step in ((0, "lm", LM_PER_AUDIO_S, lm_step), (1, "codec", CODEC_PER_AUDIO_S, codec_step)):
            steps = per_s * audio_s  # every step advances each of the `batch` streams by one item
            c = self.nodes[rank][node].setdefault(bucket(batch), [0.0, 0.0, 0.0])
            c[0] += steps
            c[1] += steps * batch
            c[2] += steps * step(batch)
        self.model.add_audio(audio_s * batch)
        for rank in (0, 1):
            self.model.observe(rank, copy.deepcopy(self.nodes[rank]))


def expected_capacity(headroom: float, lm, codec) -> int:
    b = 1
    while max(LM_PER_AUDIO_S * lm(b + 1), CODEC_PER_AUDIO_S * codec(b + 1)) <= headroom:
        b += 1
    return b


def test_capacity_is_the_largest_batch_every_rank_keeps_real_time():
    model = StreamCapacity(headroom=0.8)
    ranks = Ranks(model)
    for b in (1, 4, 8, 2, 8):
        ranks.run(b, audio_s=1.0)
    # u_lm(b) = 82 * (0.002 + 0.001 b) <= 0.8 -> b <= 7.76: the LM's rank is the bottleneck
    assert model.capacity() == expected_capacity(0.8, lm_step, codec_step) == 7
    assert model.load(7) == pytest.approx(LM_PER_AUDIO_S * lm_step(7), rel=1e-6)
    assert StreamCapacity(0.8).capacity() is None  # nothing measured yet


def test_the_fit_is_trusted_to_twice_the_largest_batch_measured_then_no_more_batching_gain():
    model = StreamCapacity(headroom=0.8)
    ranks = Ranks(model)
    for b in (1, 2, 2):
        ranks.run(b, audio_s=1.0)
    # beyond b = 2 x 2 a step costs t(4) * b / 4: 82 * 0.006 * b / 4 <= 0.8 -> b <= 6.5 (the line alone: 7)
    assert model.capacity() == 6
    ranks.run(4, audio_s=1.0)  # load explored batch 4: the line now holds to 8
    assert model.capacity() == 7


def test_one_batch_size_seen_means_every_item_costs_the_same():
    model = StreamCapacity(headroom=0.9)
    ranks = Ranks(model)
    for _ in range(3):
        ranks.run(1, audio_s=0.5)
    # proportional prior from b = 1: 82 * 0.003 * b <= 0.9 -> b <= 3.66
    assert model.capacity() == 3


def report(model: StreamCapacity, counts: dict[int, list[float]], batch: int, steps: float, step_s: float,
           audio_s: float) -> None:
    """One rank's report: ``steps`` more steps of one node at ``batch``, each ``step_s``, while the streams made
    ``audio_s`` seconds of audio."""
    c = counts.setdefault(bucket(batch), [0.0, 0.0, 0.0])
    c[0], c[1], c[2] = c[0] + steps, c[1] + steps * batch, c[2] + steps * step_s
    model.add_audio(audio_s)
    model.observe(0, {"lm": copy.deepcopy(counts)})


def test_one_stream_past_the_batch_measured_runs_while_the_prior_keeps_real_time_then_the_line_decides():
    """A step that costs 5 ms at batch 1 and 5.5 ms at batch 2 (a fixed cost, as small models on a CPU and
    decode on a GPU have), 82 steps per audio second: the prior prices two streams at 0.82 of the rank, past
    the headroom (0.8) but within EXPLORE_LOAD, so a second stream runs; its steps give the line."""
    model, counts = StreamCapacity(headroom=0.8), {}
    report(model, counts, batch=1, steps=82.0, step_s=0.005, audio_s=1.0)
    assert model.load(1) == pytest.approx(0.41) and model.load(2) == pytest.approx(0.82)
    assert model.capacity() == 2  # the prior alone: 1
    report(model, counts, batch=2, steps=82.0, step_s=0.0055, audio_s=2.0)
    # the line 4.5 ms + 0.5 ms b, trusted to batch 4, then proportional: 82 * 0.0065 * b / 4 <= 0.8 -> b <= 6
    assert model.capacity() == 6


def test_exploration_stops_where_the_prior_would_take_a_rank_past_explore_load():
    model, counts = StreamCapacity(headroom=0.8), {}
    report(model, counts, batch=1, steps=82.0, step_s=0.008, audio_s=1.0)  # 0.66 of the rank per stream
    assert model.load(2) > EXPLORE_LOAD and model.capacity() == 1
    model, counts = StreamCapacity(headroom=0.8), {}
    report(model, counts, batch=4, steps=82.0, step_s=0.009, audio_s=4.0)  # batch 4 seen: the prior prices 5 at 0.92
    assert model.capacity() == 5 and model.load(6) <= EXPLORE_LOAD  # one stream past the batch measured, no more


def test_a_restarted_worker_starts_a_new_baseline():
    model = StreamCapacity(headroom=0.8)
    ranks = Ranks(model)
    for b in (1, 4, 8):
        ranks.run(b, audio_s=1.0)
    before = model.capacity()
    model.observe(0, {"lm": {1: [3.0, 3.0, 0.01]}})  # counters from zero again
    assert model.capacity() == before


def test_a_node_that_ran_only_while_no_audio_was_made_costs_streams_nothing():
    model = StreamCapacity(headroom=0.8)
    model.observe(2, {"vision": {1: [10.0, 10.0, 5.0]}})  # an encoder, text requests only
    ranks = Ranks(model)
    for b in (1, 4, 8):
        ranks.run(b, audio_s=1.0)
    assert model.capacity() == 7 and model.load(7) == pytest.approx(LM_PER_AUDIO_S * lm_step(7), rel=1e-6)


def a_spec(i: int, max_tokens: int = 100) -> RequestSpec:
    return RequestSpec({}, id=f"s{i}", sampling=SamplingParams(max_tokens=max_tokens), audio_rate=24000, realtime=True)


def admission(budget: float = 0.0, max_streams: int = 2) -> StreamAdmission:
    a = StreamAdmission(StreamCapacity(0.8), ttfa_budget_s=budget, max_streams=max_streams, warmup=2)
    a.start(a_spec(0), 0.0)  # one stream that ran to its length: 100 tokens made 2 s of audio
    a.produced("s0", 2.0, 0.0)
    a.end("s0", ran_to_length=True)
    return a


def test_over_capacity_a_stream_is_rejected_with_the_time_until_one_ends():
    a = admission()
    assert a.capacity() == 2 and a.decide(0.0).action == "run"
    a.start(a_spec(1), 0.0)
    a.start(a_spec(2), 0.0)
    a.produced("s1", 0.5, 1.0)  # expected 2.0 s each: 1.5 s and 0.5 s left
    a.produced("s2", 1.5, 1.0)
    decision = a.decide(1.0)
    assert decision.action == "reject"
    assert decision.retry_after_s == pytest.approx(0.5)  # real time while the costs are unknown
    a.end("s2", ran_to_length=True)
    assert a.decide(1.5).action == "run"


def test_a_stream_waits_only_if_it_can_start_within_the_ttfa_budget():
    a = admission(budget=1.0)
    for i, done in ((1, 0.5), (2, 1.5)):
        a.start(a_spec(i), 0.0)
        a.produced(f"s{i}", done, 0.0)
    assert a.decide(0.0).action == "queue"  # s2 ends in 0.5 s
    a.enqueue(a_spec(3), 0.0)
    later = a.decide(0.0)  # behind s3 it would need s1 to end too: 1.5 s > 1.0 s
    assert later.action == "reject" and later.retry_after_s == pytest.approx(1.5)
    assert a.next_ready() is None
    a.end("s2", ran_to_length=False)
    assert a.next_ready()[0].id == "s3"


def test_a_stream_with_no_audio_yet_has_its_time_to_first_audio_ahead_too():
    a = admission(max_streams=1)
    a.first_audio(0.3)
    a.start(a_spec(1), 0.0)
    assert a.decide(0.0).retry_after_s == pytest.approx(2.0 + 0.3)
    a.produced("s1", 0.5, 0.0)
    assert a.decide(0.0).retry_after_s == pytest.approx(1.5)


def test_a_waiting_stream_past_its_budget_expires():
    a = admission(budget=1.0)
    a.start(a_spec(1), 0.0)
    a.start(a_spec(2), 0.0)
    a.enqueue(a_spec(3), 10.0)
    assert a.expired(10.9) == []
    assert [s.id for s in a.expired(11.1)] == ["s3"] and not a.waiting


def test_warmup_bounds_streams_until_costs_are_measured_and_max_streams_always():
    a = StreamAdmission(StreamCapacity(0.8), ttfa_budget_s=0.0, warmup=3)
    assert a.capacity() == 3
    ranks = Ranks(a.capacity_model)
    for b in (1, 4, 8):
        ranks.run(b, audio_s=1.0)
    assert a.capacity() == 7
    assert StreamAdmission(a.capacity_model, 0.0, max_streams=5).capacity() == 5


def test_remaining_time_runs_at_the_measured_pace_once_known():
    a = admission(max_streams=1)
    ranks = Ranks(a.capacity_model)
    for b in (1, 4, 8):
        ranks.run(b, audio_s=1.0)
    a.start(a_spec(1), 0.0)
    a.produced("s1", 1.0, 0.0)  # 1 s of 2 s left; one stream's audio second takes load(1) wall seconds
    assert a.decide(0.0).retry_after_s == pytest.approx(1.0 * a.capacity_model.load(1))
    assert a.capacity_model.load(1) < 1
    a.paced = True  # the ranks hold a stream far ahead of playback back: it ends at about real time
    assert a.decide(0.0).retry_after_s == pytest.approx(1.0)


def test_audio_samples_per_request_of_a_client_outs():
    stacked = m.ClientOuts("decode", "codec", "audio", "audio", ["a", "b"], [(), ()],
                           stacked=m.TensorMsg("float32", (2, 1, 2048)))
    assert audio_samples(stacked) == [2048, 2048]
    one_by_one = m.ClientOuts("decode", "codec", "audio", "audio", ["a", "b"], [(), ()],
                              values=[m.TensorMsg("float32", (4096,)), [0.0] * 5])
    assert audio_samples(one_by_one) == [4096, 5]
    assert math.isfinite(StreamAdmission(StreamCapacity(0.8), 1.0).retry_after(0.0))


def test_a_stream_out_of_audio_caps_admission_until_calm_returns():
    a = StreamAdmission(StreamCapacity(0.8), ttfa_budget_s=0.0, warmup=4)
    for i in range(3):
        a.start(a_spec(i), 0.0)
        a.produced(f"s{i}", 1.0, 0.5)  # first audio at 0.5 s: a 0.5 s buffer, 1 s of audio: due at 2.0 s
    a.tick(1.9)
    assert a.capacity() == 4 and a.ceiling is None
    a.produced("s0", 1.0, 1.9)
    a.tick(2.1)  # s1 and s2 ran out
    assert a.capacity() == 2 and a.decide(2.1).action != "run"
    a.end("s1", ran_to_length=False)
    a.end("s2", ran_to_length=False)
    a.produced("s0", 5.0, 2.2)  # s0 is well ahead again (due at 8.0 s)
    a.tick(2.2)  # calm again: the cap holds for RECOVER_S, then rises one stream at a time
    assert a.capacity() == 2
    a.tick(2.2 + RECOVER_S)
    assert a.capacity() == 3
    a.tick(2.3 + 2 * RECOVER_S)
    assert a.capacity() == 4 and a.ceiling is None  # back at the estimate: lifted


def test_the_desk_reports_the_load_of_the_streams_running_and_none_when_none_runs():
    from walkserve.conductor.stream_desk import StreamDesk
    from walkserve.core.config import RuntimeConfig

    desk = StreamDesk(RuntimeConfig())
    ranks = Ranks(desk.model)
    for b in (1, 4, 8):
        ranks.run(b, audio_s=1.0)
    assert desk.snapshot()["load"] == 0.0 and desk.snapshot()["capacity"] == 7
    desk.started(a_spec(1), 0.0)
    assert desk.snapshot()["load"] == pytest.approx(desk.model.load(1)) and desk.snapshot()["running"] == 1


def test_retry_after_is_when_the_soonest_stream_ends_at_the_pace_its_chunks_came():
    """On a virtual clock: each admitted stream ends when its remaining audio is made at its own measured
    pace from its latest chunk, not at real time (deadline scheduling paces only full steps)."""
    a = admission()  # 100 tokens make 2 s of audio; at most 2 streams
    a.paced = True
    a.start(a_spec(1), 0.0)
    for t in (0.3, 0.55, 0.8):  # 0.5 s chunks every 0.25 s: twice real time, 0.5 s of audio left
        a.produced("s1", 0.5, t)
    a.start(a_spec(2), 0.1)
    for t in (0.5, 1.0):  # real time: 1 s left
        a.produced("s2", 0.5, t)
    assert a.frees_in(1.0) == pytest.approx([0.05, 1.0])  # s1 ends at 0.8 + 0.5 * 0.5, s2 at 1.0 + 1.0
    decision = a.decide(0.85)
    assert decision.action == "reject" and decision.retry_after_s == pytest.approx(0.2)
    a.produced("s1", 0.5, 1.1)  # its last chunk came later than the pace said: nothing left, so no wait
    assert a.frees_in(1.1)[0] == 0.0 and a.retry_after(1.1) == pytest.approx(0.1)  # the floor
    a.end("s1", ran_to_length=True)
    assert a.decide(1.1).action == "run"
    a.start(a_spec(3), 2.0)
    a.produced("s3", 0.5, 2.5)
    a.produced("s3", 0.5, 2.5)  # one chunk in two messages: no pace measured from it (not zero)
    assert a.active["s3"].pace() is None
