"""Admission past the capacity model's estimate on measured slack (SlackProbe), on a virtual clock.

The machine here carries ``S`` streams at real time: b streams at once each make audio at ``S / b`` audio
seconds per wall second (a step's cost in proportion to its batch, as the worst case the probe assumes). The
capacity model, fed an LM rank whose step costs 2 ms + 1 ms per stream at 82 steps per audio second, says
7 streams at headroom 0.8 (82 * (0.002 + 0.001 * 7) = 0.74; at 8: 0.82); with S = 14 it is 2x conservative,
as the tiny Orpheus bench found it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from walkserve.conductor.capacity import StreamCapacity
from walkserve.conductor.slack_probe import LOWER_EVERY_S, RAISE_S, Ahead, SlackProbe, least_lead
from walkserve.conductor.stream_admission import Stream, StreamAdmission
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams

LM_PER_AUDIO_S = 82.0


def a_spec(i: int, max_tokens: int = 100) -> RequestSpec:
    return RequestSpec({}, id=f"s{i}", sampling=SamplingParams(max_tokens=max_tokens), audio_rate=24000, realtime=True)


def model_of_seven() -> StreamCapacity:
    model = StreamCapacity(0.8)
    counts: dict[int, list[float]] = {}
    for batch, bucket in ((1, 1), (4, 4), (8, 8)):
        steps = LM_PER_AUDIO_S  # one audio second of `batch` streams: 82 steps of `batch` members
        counts[bucket] = [steps, steps * batch, steps * (0.002 + 0.001 * batch)]
        model.add_audio(batch)
        model.observe(0, {"lm": {b: list(c) for b, c in counts.items()}})
    assert model.capacity() == 7
    return model


def test_least_lead_is_the_tightest_chunk_ahead():
    # a listener holds 1.1 s at the latest chunk, 1.5 s are still to come in 0.5 s chunks
    assert least_lead(1.1, 1.5, 0.5, 0.8) == pytest.approx(1.1 - 0.5 * 0.8)  # the next chunk is the tightest
    # at 1.2 wall s per audio s the chunks come at +0.6, +1.2, +1.8 s while 1.1, 1.6, 2.1 s were held: 0.3 s left
    assert least_lead(1.1, 1.5, 0.5, 1.2) == pytest.approx(0.3)
    assert least_lead(0.4, 0.2, 0.5, 2.0) == pytest.approx(0.4 + 0.2 * (1 - 2.0) - 0.2)  # a last, shorter chunk
    assert least_lead(0.7, 0.0, 0.5, 3.0) == 0.7  # nothing more to come


def test_a_stream_keeps_a_recent_pace_of_its_whole_chunks_and_the_streams_that_ran_meanwhile():
    s = Stream(a_spec(1), admitted_at=0.0)
    s.add(0.5, 0.4, running=2)  # first audio at 0.4 s: a 0.4 s buffer
    s.add(0.25, 0.8, running=2)
    s.add(0.25, 0.8, running=2)  # one chunk in two messages
    assert s.recent is None and s.chunks == 2
    s.add(0.5, 1.4, running=3)  # the chunk at 0.8 s is whole: 0.5 s of audio in 0.4 s, while 2 ran
    assert s.recent == pytest.approx(0.8) and s.streams == 2
    s.add(0.5, 2.0, running=3)  # the chunk at 1.4 s: 0.5 s in 0.6 s, while 3 ran
    assert s.recent == pytest.approx(0.7 * 0.8 + 0.3 * 1.2) and s.streams == pytest.approx(0.7 * 2 + 0.3 * 3)
    # 2 s sent by 2.0 s: the listener, from 0.8 s, plays until 2.8 s; 1 s left in 0.5 s chunks
    at = 0.92 * 3 / 2.3  # its pace were 3 streams running
    assert s.ahead(3.0, now=2.0, streams=3) == Ahead(pytest.approx(at), pytest.approx(least_lead(0.8, 1.0, 0.5, at)))
    late = s.ahead(3.0, now=2.8, streams=2)  # no chunk since: 0.8 s for less than 0.5 s of audio so far
    assert late == Ahead(pytest.approx(1.6), pytest.approx(0.8 + 1.0 * (1 - 1.6) - 0.5)) and late.behind()
    assert s.ahead(2.0, now=2.0, streams=3) is None  # all its expected audio is out


def test_one_more_stream_is_projected_from_the_running_ones():
    a = StreamAdmission(model_of_seven(), ttfa_budget_s=0.0)
    a.start(a_spec(0), 0.0)  # ran to its length: 100 tokens made 3 s
    a.produced("s0", 3.0, 0.0)
    a.end("s0", ran_to_length=True)
    a.first_audio(0.6)
    a.start(a_spec(1), 0.0)
    a.start(a_spec(2), 0.0)
    for seconds, t in ((0.5, 0.4), (0.5, 0.8), (0.5, 1.4), (0.5, 2.0)):  # recent pace 0.92 while 2 ran, buffer 0.4
        a.produced("s1", seconds, t)
        a.produced("s2", seconds / 2, t)
    s1, s2, fresh = a.ahead(2.0, 2)
    assert s1 == a.active["s1"].ahead(3.0, 2.0, 2) and s2.pace == pytest.approx(2 * 0.92)
    # one more: behind min(TTFA 0.6, the least buffer 0.4), the mean chunk 0.375 s, 3 s expected, the slowest pace
    assert fresh == Ahead(pytest.approx(1.84), pytest.approx(least_lead(0.4 + 0.375, 3.0 - 0.375, 0.375, 1.84)))
    assert fresh.behind() and not fresh.keeps_up()
    assert a.ahead(2.0, 1)[0].pace == pytest.approx(0.46)  # s1 alone would run twice as fast


def test_the_desk_reports_the_streams_admitted_past_the_estimate():
    from walkserve.conductor.stream_desk import StreamDesk
    from walkserve.core.config import RuntimeConfig

    desk = StreamDesk(RuntimeConfig())
    desk.model = desk.admission.capacity_model = model_of_seven()
    desk.admission.probe.bound = 9
    snapshot = desk.snapshot()
    assert snapshot["capacity"] == 9 and snapshot["estimate"] == 7 and snapshot["probed"] == 2


@dataclass
class Playing:
    """One stream on the virtual machine and its listener (as the bench's client: a start-up buffer of
    min(TTFA, 1 s), a gap when a chunk comes after the audio before it has played)."""

    admitted: float
    made: float = 0.0
    sent: float = 0.0
    first: float | None = None
    gaps: int = 0
    arrivals: list[float] = field(default_factory=list)

    def arrive(self, now: float, chunk: float) -> None:
        if self.first is None:
            self.first = now
            return
        start = self.first + min(1.0, self.first - self.admitted)
        if now > start + self.sent + 1e-9:
            self.gaps += 1
        self.sent += chunk


@dataclass
class Run:
    """Streams of ``audio_s`` seconds in ``chunk`` s chunks, a prefill of ``prefill_s`` before the first, one
    more always waiting to start; the machine carries ``sustains(t)`` streams at real time."""

    audio_s: float
    sustains: object  # t -> streams carried at real time
    chunk: float = 0.25
    prefill_s: float = 0.2
    dt: float = 0.01
    admission: StreamAdmission = field(default_factory=lambda: StreamAdmission(model_of_seven(), 0.0, warmup=2))
    playing: dict[str, Playing] = field(default_factory=dict)
    ended: list[Playing] = field(default_factory=list)
    capacity: list[tuple[float, int]] = field(default_factory=list)
    count: int = 0

    def __post_init__(self) -> None:
        self.admission.start(a_spec(0), 0.0)  # one stream that ran to its length teaches the expected audio
        self.admission.produced("s0", self.audio_s, 0.0)
        self.admission.end("s0", ran_to_length=True)

    def until(self, end_s: float) -> None:
        t = self.capacity[-1][0] + self.dt if self.capacity else 0.0
        while t < end_s:
            self.step(t)
            t += self.dt

    def step(self, now: float) -> None:
        a = self.admission
        a.tick(now)
        while a.decide(now).action == "run":
            self.count += 1
            a.start(a_spec(self.count), now)
            self.playing[f"s{self.count}"] = Playing(now)
        rate = self.sustains(now) / len(self.playing)  # audio seconds per wall second of each stream
        for rid, p in list(self.playing.items()):
            if now - p.admitted < self.prefill_s:
                continue
            p.made += rate * self.dt
            while p.made - p.sent >= self.chunk - 1e-9 and p.sent < self.audio_s - 1e-9:
                if p.first is None:
                    a.first_audio(now - p.admitted)  # as the conductor does: the measured TTFA
                p.arrive(now, self.chunk)
                a.produced(rid, self.chunk, now)
            if p.sent >= self.audio_s - 1e-9:
                a.end(rid, ran_to_length=True)
                self.ended.append(self.playing.pop(rid))
        self.capacity.append((now, a.capacity()))

    def gaps(self) -> int:
        return sum(p.gaps for p in [*self.ended, *self.playing.values()])

    def most(self, since: float = 0.0) -> int:
        return max(c for t, c in self.capacity if t >= since)


def test_streams_are_admitted_up_to_what_the_machine_carries_within_pace_max():
    """At b streams each runs at b / 14 wall s per audio s: 12 run at 0.857 and a 13th would make it 0.929, past
    PACE_MAX (0.9). So the bound stops at 12, not at the model's 7, and no stream has a gap."""
    run = Run(audio_s=8.0, sustains=lambda t: 14.0)
    run.step(0.0)
    assert run.admission.capacity() == 7 and run.admission.estimate() == 7  # the model's estimate to start
    run.until(30.0)
    assert run.admission.capacity() == 12 and run.most() == 12
    assert run.admission.probe.above(run.admission.estimate()) == 5
    assert run.gaps() == 0 and len(run.ended) > 30


def test_short_streams_turning_over_are_admitted_within_real_time():
    """2 s streams end and start all the time: a pace measured while one slot was being refilled (0.2 s of
    prefill) reads up to one stream low, so the bound may stand one past 12, never past real time."""
    run = Run(audio_s=2.0, sustains=lambda t: 14.0)
    run.until(30.0)
    assert 12 <= run.admission.capacity() <= run.most() <= 13
    assert run.gaps() == 0 and len(run.ended) > 150


def test_a_machine_that_slows_lowers_the_bound_at_once():
    """At 40 s the machine carries 10 streams, not 14: the 12 running fall behind (1.2 wall s per audio s), the
    bound falls below 12 within LOWER_EVERY_S of the first short lead and settles at 0.9 x 10 = 9 or below."""
    run = Run(audio_s=8.0, sustains=lambda t: 14.0 if t < 40.0 else 10.0)
    run.until(40.0)
    assert run.admission.capacity() == 12
    run.until(41.0 + LOWER_EVERY_S)
    assert run.most(since=41.0) < 12
    run.until(90.0)
    assert run.most(since=70.0) <= 9


def test_below_the_bound_nothing_is_learned_and_the_estimate_is_the_floor():
    def calm(streams: int) -> list[Ahead]:  # 0.75 wall s per audio s while 7 ran
        return [Ahead(0.75 * streams / 7, 0.3)]

    probe = SlackProbe()
    probe.tick(0.0, 7, 6, calm)  # 6 streams run under a bound of 7: no evidence
    probe.tick(RAISE_S + 0.1, 7, 6, calm)
    assert probe.admits(7) == 7
    probe.tick(2.0, 7, 7, calm)  # at the bound, room for one more: 0.75 x 8 / 7 = 0.86; 0.75 x 9 / 7 = 0.96
    probe.tick(2.0 + RAISE_S, 7, 7, calm)
    assert probe.admits(7) == 8
    assert probe.admits(9) == 9 and probe.above(9) == 0  # the model caught up
    def tight(streams: int) -> list[Ahead]:  # 0.85 x 9 / 8 = 0.96: no room
        return [Ahead(0.85 * streams / 8, 0.3)]

    probe.tick(4.0, 7, 8, tight)
    probe.tick(4.0 + 2 * RAISE_S, 7, 8, tight)
    assert probe.admits(7) == 8
    probe.tick(7.0, 7, 8, lambda streams: [Ahead(1.1, 0.05)])  # falling behind: one stream fewer at once
    assert probe.admits(7) == 7 and probe.bound is None


def test_the_bound_rises_by_the_streams_the_projection_bears_at_most_doubling():
    measured = [0.3, 2]  # the streams' pace (wall s per audio s) and the streams that ran meanwhile

    def ahead(streams: int) -> list[Ahead]:
        pace = measured[0] * streams / measured[1]
        return [Ahead(pace, 0.5), Ahead(pace, 0.2)]

    probe = SlackProbe()
    probe.tick(0.0, 2, 2, ahead)
    probe.tick(RAISE_S, 2, 2, ahead)
    assert probe.admits(2) == 4  # 0.3 x 6 / 2 = 0.9 would keep within PACE_MAX too, but a doubling is the most
    measured[:] = [0.5, 4]
    probe.tick(2 * RAISE_S, 2, 4, ahead)
    probe.tick(3 * RAISE_S, 2, 4, ahead)
    assert probe.admits(2) == 7  # 0.5 x 7 / 4 = 0.875 keeps within PACE_MAX; 0.5 x 8 / 4 = 1.0 does not
    measured[:] = [0.5, 2]  # the pace was measured while 2 ran, not 7: 0.5 x 8 / 2 = 2.0
    probe.tick(4 * RAISE_S, 2, 7, ahead)
    probe.tick(5 * RAISE_S, 2, 7, ahead)
    assert probe.admits(2) == 7
