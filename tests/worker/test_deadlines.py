"""The deadline scheduler on a virtual clock: EDF order, first chunks, aging of deadline-free work, pacing, gaps.

Members are stand-ins (a request id, an iteration, a walk); the nodes are the
compiled Orpheus decode walk's ``lm`` and ``codec`` with their declared playback.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from walkserve.core.config import RuntimeConfig
from walkserve.core.errors import ConfigError, GraphError
from walkserve.core.scheduling import FIFO, StreamScheduling
from walkserve.graph import Playback
from walkserve.models.orpheus.graph import FRAME_S, build_graph
from walkserve.models.qwen3_omni.speech.graph import TALKER_DECODE, DepthRanges, build_speech_graph
from walkserve.protocol.rank_stats import SLACK_EDGES_S
from walkserve.protocol.run import RunSpec, decode_run_spec, encode_run_spec
from walkserve.worker.deadlines import Deadlines, Tier, slack_bucket
from walkserve.worker.program import compile_program
from walkserve.worker.step_costs import StepCosts, bucket

PROGRAM = compile_program(build_graph().plans["decode"])
LM, CODEC = PROGRAM.nodes["lm"], PROGRAM.nodes["codec"]
TEXT = SimpleNamespace(plan=SimpleNamespace(walk=SimpleNamespace(playback={})))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def member(rid: str, k: int = 0, program=PROGRAM, stream: bool = False):
    streamed = stream or bool(program.plan.walk.playback)  # as ``WalkRun`` works it out
    return SimpleNamespace(rid=rid, k=k, run=SimpleNamespace(program=program, request=SimpleNamespace(stream=stream),
                                                             streamed=streamed))


def scheduler(**config) -> tuple[Deadlines, Clock, StepCosts]:
    clock, costs = Clock(), StepCosts()
    return Deadlines(StreamScheduling(**config), costs, clock), clock, costs


def started(d: Deadlines, clock: Clock, m, at: float) -> None:
    """``m``'s playback clock starts at ``at``: its LM completes the first chunk (token 28) then."""
    t, clock.t = clock.t, at
    d.pick(LM, [m], None)
    d.ran(LM, [member(m.rid, 27)])
    clock.t = t


def test_playback_counts_orpheus_chunks():
    p = LM.playback
    assert [p.chunks(n) for n in (0, 27, 28, 34, 35, 42)] == [0, 0, 1, 1, 2, 3]
    assert p.audio_after(27) == 0.0
    assert p.audio_after(28) == pytest.approx(2 * FRAME_S)
    assert p.audio_after(35) == pytest.approx(3 * FRAME_S)
    assert [p.to_next_chunk(n) for n in (0, 27, 28, 30, 34)] == [28, 1, 7, 5, 1]
    assert CODEC.playback.audio_after(1) == pytest.approx(2 * FRAME_S) and CODEC.downstream == ()
    assert LM.downstream == ("codec",)
    with pytest.raises(GraphError):
        Playback(0.0)


def test_step_costs_learn_by_batch_bucket():
    costs = StepCosts()
    assert costs.estimate("lm", 4) == 0.0
    costs.observe("lm", 3, 0.010)
    costs.observe("lm", 4, 0.020)  # same bucket (4): a moving mean
    assert bucket(3) == bucket(4) == 4 and bucket(1) == 1 and bucket(5) == 8
    assert costs.estimate("lm", 4) == pytest.approx(0.010 + 0.2 * 0.010)
    assert costs.estimate("lm", 16) == pytest.approx(4 * costs.estimate("lm", 4))  # scaled from the nearest
    assert costs.estimate("lm", 1) == costs.estimate("lm", 4)  # never below a measured larger batch
    assert costs.snapshot() == {"lm": {4: pytest.approx(0.012)}}


def test_least_slack_first_when_the_step_is_full():
    d, clock, costs = scheduler()
    costs.observe("lm", 2, 0.005)
    a, b, c = member("a", 40), member("b", 40), member("c", 40)
    for m, at in ((a, 1.0), (b, 0.2), (c, 0.6)):
        started(d, clock, m, at)
    clock.t = 1.2
    take, wait = d.pick(LM, [a, b, c], capacity=2)
    assert [m.rid for m in take] == ["b", "c"]  # b started first: its audio runs out first
    assert [m.rid for m in wait] == ["a"]
    assert d.counts["held_capacity"] == 1


def test_slack_is_deadline_minus_now_minus_the_next_chunks_cost():
    d, clock, costs = scheduler()
    costs.observe("lm", 1, 0.004)
    costs.observe("codec", 1, 0.010)
    m = member("a", 30)
    started(d, clock, m, 1.0)
    clock.t = 1.1
    p = d.priority(LM, m, 1, clock.t)
    # 30 tokens done: the client has 2 frames; 5 tokens to the next chunk, then one codec step
    assert p.slack == pytest.approx(1.0 + 2 * FRAME_S - 1.1 - 5 * 0.004 - 0.010)
    assert p.tier is Tier.URGENT  # below urgent_slack_s (0.25)


def test_streams_about_to_gap_then_first_chunks_then_the_rest():
    d, clock, _ = scheduler(urgent_slack_s=0.1, pace_slack_s=5.0)
    late, ahead, new = member("late", 29), member("ahead", 200), member("new", 3)
    started(d, clock, late, 0.0)
    started(d, clock, ahead, 0.0)
    clock.t = 0.15  # late has 2 frames (0.17 s): slack ~0.02; ahead has ~2.4 s of audio
    take, wait = d.pick(LM, [ahead, new, late], capacity=2)
    assert [m.rid for m in take] == ["late", "new"]
    assert [m.rid for m in wait] == ["ahead"]
    assert d.priority(LM, new, 1, clock.t).tier is Tier.FIRST


def test_a_streamed_requests_prefill_counts_toward_its_first_chunk():
    d, clock, _ = scheduler()
    prefill = compile_program(build_graph().plans["prefill"]).nodes["lm"]
    speech, text = member("speech", 0, TEXT, stream=True), member("text", 0, TEXT)
    take, _ = d.pick(prefill, [text, speech], capacity=1)
    assert [m.rid for m in take] == ["speech"]
    assert d.priority(prefill, speech, 1, clock.t).tier is Tier.FIRST
    assert d.priority(prefill, text, 1, clock.t).tier is Tier.FREE


def test_deadlines_travel_to_nodes_without_playback_on_the_path():
    talk = compile_program(build_speech_graph([(0, 128), (230, 231)], DepthRanges(128), 16, 3, frame_s=0.08)
                           .plans[TALKER_DECODE])
    talker, step, code2wav = talk.nodes["talker"], talk.nodes["code_predictor_step"], talk.nodes["code2wav"]
    assert talker.playback.to_next_chunk(0) == 25 and talker.downstream == ("code2wav",)
    assert code2wav.playback.audio_after(1) == pytest.approx(2.0) and step.playback is None
    d, clock, costs = scheduler()
    costs.observe("talker", 1, 0.01)
    frame = member("a", 25, talk)
    d.pick(talker, [frame], None)
    d.ran(talker, [member("a", 24, talk)])  # frame 24 done: the first chunk (25 frames) is complete
    clock.t = 1.9
    slack = d.priority(talker, frame, 1, clock.t).slack
    assert slack == pytest.approx(2.0 - 1.9 - 25 * 0.01)
    depth = member("a", 3, talk)  # a code predictor step: iteration 3 of the depth loop, no playback of its own
    assert d.priority(step, depth, 1, clock.t) == (Tier.URGENT, slack, slack, False)


def test_plain_work_that_fits_runs_untouched():
    d, _, _ = scheduler()
    texts = [member(f"t{i}", 0, TEXT) for i in range(3)]
    assert d.pick(LM, texts, capacity=3) == (texts, [])
    assert d.clocks == {} and d.waiting == 3  # no clock kept, but it counts as work waiting (pacing)


def test_deadline_free_work_is_not_starved():
    d, clock, _ = scheduler(aging_s=0.5, pace_slack_s=50.0)
    stream, text = member("s", 600), member("t", 0, TEXT)
    started(d, clock, stream, 0.0)
    for step in range(5):  # the stream has slack to spare and wins the one slot ...
        clock.t = 0.01 * step
        take, _ = d.pick(LM, [text, stream], capacity=1)
        assert [m.rid for m in take] == ["s"]
        d.ran(LM, take)
    clock.t = 0.6  # ... until the text request waited past the aging bound
    take, wait = d.pick(LM, [text, stream], capacity=1)
    assert [m.rid for m in take] == ["t"] and [m.rid for m in wait] == ["s"]
    d.ran(LM, take)
    clock.t = 0.61
    assert [m.rid for m in d.pick(LM, [text, stream], capacity=1)[0]] == ["s"]


def test_pacing_holds_streams_far_ahead_only_while_others_wait_for_a_full_step():
    d, clock, _ = scheduler(pace_slack_s=1.0)
    ahead, ahead2, new = member("ahead", 400), member("ahead2", 400), member("new", 0)
    started(d, clock, ahead, 0.0)
    started(d, clock, ahead2, 0.0)
    clock.t = 0.5  # the two ahead have ~4.5 s of audio left to play
    take, wait = d.pick(LM, [ahead, new], capacity=1)
    assert [m.rid for m in take] == ["new"] and [m.rid for m in wait] == ["ahead"]
    assert d.counts["held_paced"] == 1
    d.new_pass()  # the pass before had other work: held once more ...
    assert d.pick(LM, [ahead, ahead2], capacity=1) == ([], [ahead, ahead2])
    d.new_pass()  # ... and then nothing else is waiting: the step takes one
    assert d.pick(LM, [ahead, ahead2], capacity=1)[0] == [ahead]
    d.new_pass()
    assert d.pick(LM, [ahead, new], capacity=None) == ([new, ahead], [])  # room for both: nothing is held
    assert d.counts["held_paced"] == 3


def test_fifo_takes_every_member_in_order_and_still_measures():
    d, clock, _ = scheduler(mode=FIFO)
    a, b = member("a", 400), member("b", 0)
    started(d, clock, a, 0.0)
    clock.t = 0.5
    assert d.pick(LM, [a, b], capacity=1) == ([a, b], [])
    assert sum(d.slack_counts["lm"]) == 1  # a's slack at dispatch (b has no clock yet)


def test_the_emitting_node_counts_gaps():
    d, clock, _ = scheduler()
    m = member("a")
    d.pick(CODEC, [m], None)
    for k, at in ((0, 1.0), (1, 1.1), (2, 1.35), (3, 1.4)):  # chunk 0 plays 2 frames (0.17 s): chunk 1 in time
        clock.t = at
        d.ran(CODEC, [member("a", k)])
    # chunk 2 was due at 1.0 + 3 frames = 1.256; the client plays on from 1.35, so chunk 3 (due 1.435) is in time
    assert d.counts["gaps"] == 1 and d.gap_s == pytest.approx(1.35 - 1.0 - 3 * FRAME_S)


def test_slack_buckets_and_config():
    assert slack_bucket(-2.0) == 0 and slack_bucket(0.0) == SLACK_EDGES_S.index(0.0)
    assert slack_bucket(99.0) == len(SLACK_EDGES_S)
    with pytest.raises(ConfigError):
        StreamScheduling(mode="lifo")
    with pytest.raises(ConfigError):
        StreamScheduling(urgent_slack_s=1.0, pace_slack_s=0.5)


def test_the_mode_reaches_the_workers_through_the_run_spec():
    config = RuntimeConfig(stream_scheduling=StreamScheduling(FIFO, pace_slack_s=3.0))
    spec = decode_run_spec(encode_run_spec(RunSpec("r0", "tok", "/tmp", "fixture-lm", None, {}, {}, "<t>", config)))
    assert spec.config.stream_scheduling == StreamScheduling(FIFO, pace_slack_s=3.0)
    assert not spec.config.stream_scheduling.by_deadline
