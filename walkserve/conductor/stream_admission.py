"""StreamAdmission: real-time streams are admitted by capacity, not by count.

A streamed audio answer (``RequestSpec.realtime``) is admitted only while
every admitted stream plus this one stays real-time (``StreamCapacity``).
Otherwise it waits, but only if a stream is expected to end in time for it
to start within the time-to-first-audio budget; else it is rejected at once
with ``Retry-After`` = the estimated time until a slot frees. Times are
passed in (``now``), so the decisions test on a virtual clock.

The model can be wrong (a machine whose other jobs took its cores, a step
cost not measured yet), so what happened corrects it: the conductor keeps each
admitted stream's playback clock from the audio it forwards (as the client's:
from the first audio, after a start-up buffer of min(TTFA, 1 s)). While a
stream has run out of audio, admission is capped at one stream fewer than
run now; the cap rises by one per ``RECOVER_S`` without a stream running
out, and is lifted when it reaches the model's estimate.

Remaining time of an admitted stream (``Retry-After``): its expected audio
(``max_tokens`` x the audio seconds per token learned from streams that ran
to their length, else the mean audio of finished streams) minus what it
produced, at the pace its own chunks came (wall seconds per audio second
since its first chunk), counted from its latest chunk. Before its second
chunk, at the model's pace: ``load(b)`` of the capacity model (at most 1:
admitted streams keep ahead of real time), or 1 while the costs are unknown
or when the ranks pace streams.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from walkserve.conductor.capacity import StreamCapacity
from walkserve.conductor.slack_probe import Ahead, SlackProbe, least_lead
from walkserve.core.request import RequestSpec

EWMA = 0.2  # weight of the newest sample in the running means (audio per token, TTFA)
DEFAULT_AUDIO_S = 1.0  # a stream's expected audio before any stream finished
BUFFER_MAX_S = 1.0  # a listener's start-up buffer: min(TTFA, this)
RECOVER_S = 2.0  # after a stream ran out of audio, the cap rises by one stream per this many calm seconds
RECENT = 0.3  # weight of a stream's newest chunk in its recent pace
PROBE_EVERY_S = 0.05  # the streams' projected leads are weighed this often (the heartbeat runs far more often)


@dataclass
class Stream:
    spec: RequestSpec
    admitted_at: float
    audio_s: float = 0.0
    first_at: float | None = None  # when its first audio left
    first_s: float = 0.0  # the audio seconds of its first chunk
    last_at: float | None = None  # when its latest audio left
    chunks: int = 0  # chunks: audio leaving at distinct moments
    recent: float | None = None  # wall seconds per audio second of its latest chunks (a running mean)
    streams: float = 1.0  # streams running while those chunks were made (the same running mean)
    _before_at: float | None = None  # when the chunk before its latest left
    _chunk_s: float = 0.0  # the audio seconds of its latest chunk (so far)
    _chunk_streams: int = 1  # streams running when its latest chunk left

    def add(self, seconds: float, now: float, running: int = 1) -> None:
        """Audio of it left at ``now`` while ``running`` streams ran (a chunk may come in several messages at
        one moment)."""
        if self.first_at is None:
            self.first_at, self.first_s = now, seconds
        if self.last_at != now:  # a new chunk: the one before is whole, its pace joins the running mean
            if self._before_at is not None and self.last_at is not None and self._chunk_s > 0:
                self._note((self.last_at - self._before_at) / self._chunk_s, self._chunk_streams)
            self._before_at, self._chunk_s, self.chunks = self.last_at, 0.0, self.chunks + 1
        self._chunk_s += seconds
        self._chunk_streams = running
        self.audio_s += seconds
        self.last_at = now

    def _note(self, pace: float, streams: int) -> None:
        if self.recent is None:
            self.recent, self.streams = pace, float(streams)
        else:
            self.recent += RECENT * (pace - self.recent)
            self.streams += RECENT * (streams - self.streams)

    def pace(self) -> float | None:
        """Wall seconds per audio second since its first chunk (None: no later chunk yet, or only at the same
        moment: one chunk in several messages)."""
        if self.first_at is None or self.last_at is None or self.audio_s <= self.first_s or self.last_at <= self.first_at:
            return None
        return (self.last_at - self.first_at) / (self.audio_s - self.first_s)

    def ends_in(self, expected_s: float, pace: float, ttfa_s: float, now: float) -> float:
        """Seconds from ``now`` until it has made ``expected_s`` of audio: the rest at ``pace`` from its latest
        chunk (a stream with no audio yet has its time to first audio ahead too)."""
        left = max(0.0, expected_s - self.audio_s) * pace
        if self.last_at is None:
            return left + ttfa_s
        return max(0.0, self.last_at + left - now)

    def buffer_s(self) -> float:
        """Its listener's start-up buffer: its time to first audio, at most BUFFER_MAX_S."""
        assert self.first_at is not None
        return min(BUFFER_MAX_S, self.first_at - self.admitted_at)

    def played_out_at(self) -> float:
        """When its listener will have played every second sent so far (start-up buffer included)."""
        assert self.first_at is not None
        return self.first_at + self.buffer_s() + self.audio_s

    def ran_out(self, now: float) -> bool:
        """Its listener has played every second sent so far (the playback clock, start-up buffer included)."""
        return self.first_at is not None and now > self.played_out_at()

    def ahead(self, expected_s: float, now: float, streams: int) -> Ahead | None:
        """Its pace and least lead ahead were ``streams`` streams running (None: no recent pace yet, or no audio
        expected still): its recent pace, scaled from the streams that ran while it was measured (a step costs
        at most in proportion to its batch), or the time since its latest chunk per audio second of a chunk
        when that is longer (a chunk late against its pace shows here at once)."""
        if self.recent is None or self.last_at is None or self.audio_s >= expected_s:
            return None
        chunk = self.audio_s / self.chunks
        pace = max(self.recent * streams / self.streams, (now - self.last_at) / chunk)
        return Ahead(pace, least_lead(self.played_out_at() - self.last_at, expected_s - self.audio_s, chunk, pace))


@dataclass(frozen=True)
class Decision:
    action: str  # run | queue | reject
    retry_after_s: float = 0.0


@dataclass
class StreamAdmission:
    capacity_model: StreamCapacity
    ttfa_budget_s: float
    max_streams: int = 0  # 0: no bound beyond the estimated capacity
    warmup: int = 2  # streams admitted at once before any cost is measured
    max_waiting: int = 1024
    paced: bool = False  # the ranks hold streams far ahead of playback back: they end at about real time
    active: dict[str, Stream] = field(default_factory=dict)
    waiting: deque[tuple[RequestSpec, float]] = field(default_factory=deque)
    audio_per_token: float | None = None
    mean_audio_s: float | None = None
    ttfa_s: float = 0.0
    ceiling: int | None = None  # the cap after a stream ran out of audio (None: none)
    probe: SlackProbe = field(default_factory=SlackProbe)
    _calm_at: float = 0.0
    _probed_at: float = float("-inf")

    # ---- the estimate -------------------------------------------------------------------------
    def estimate(self) -> int:
        """The model's capacity (``warmup`` while unknown), within ``max_streams``."""
        estimate = self.capacity_model.capacity()
        cap = self.warmup if estimate is None else estimate
        return min(cap, self.max_streams) if self.max_streams > 0 else cap

    def capacity(self) -> int:
        """Streams admitted at once now: the estimate, or the bound measured slack allows past it, within
        ``max_streams``; under the cap a stream running out of audio set."""
        cap = self.probe.admits(self.estimate()) if self.capacity_model.known else self.estimate()
        cap = min(cap, self.max_streams) if self.max_streams > 0 else cap
        return cap if self.ceiling is None else min(cap, self.ceiling)

    def tick(self, now: float) -> None:
        """Called every heartbeat: a stream out of audio caps admission below today's count; calm lifts it;
        projected leads move the bound past the estimate."""
        if any(s.ran_out(now) for s in self.active.values()):
            self.ceiling = max(1, min(self.ceiling or len(self.active), len(self.active) - 1))
            self._calm_at = now
            self.probe.reset()
        elif self.ceiling is not None and now - self._calm_at >= RECOVER_S:
            self.ceiling, self._calm_at = self.ceiling + 1, now
            if self.ceiling >= self.estimate():
                self.ceiling = None
        elif self.ceiling is None and self.capacity_model.known and now - self._probed_at >= PROBE_EVERY_S:
            self._probed_at = now
            self.probe.tick(now, self.estimate(), len(self.active), lambda streams: self.ahead(now, streams))

    def ahead(self, now: float, streams: int) -> list[Ahead]:
        """The pace and least lead ahead of each running stream with a recent pace, and of one more, were
        ``streams`` streams running (empty: no stream has a pace yet). The one more stands in for a new stream
        and for those too new to have a pace: behind the least of their start-up buffers and the measured TTFA,
        with their mean chunk, the longest expected audio and the slowest pace."""
        paced = [s for s in self.active.values() if s.recent is not None]
        ahead = [a for s in paced if (a := s.ahead(self.expected_audio_s(s.spec), now, streams)) is not None]
        if not ahead:
            return []
        chunk = sum(s.audio_s for s in paced) / sum(s.chunks for s in paced)
        expected = max(self.expected_audio_s(s.spec) for s in paced)
        buffer = min(self.ttfa_s, *(s.buffer_s() for s in paced))
        pace = max(a.pace for a in ahead)
        return [*ahead, Ahead(pace, least_lead(buffer + chunk, expected - chunk, chunk, pace))]

    def expected_audio_s(self, spec: RequestSpec) -> float:
        max_tokens = spec.sampling.max_tokens
        if self.audio_per_token is not None and max_tokens:
            return max_tokens * self.audio_per_token
        return self.mean_audio_s if self.mean_audio_s is not None else DEFAULT_AUDIO_S

    def frees_in(self, now: float) -> list[float]:
        """Seconds until each admitted stream ends, soonest first: each at the pace its own chunks came at
        (wall seconds per audio second), else at the model's (the load of the streams running, or real time
        while the costs are unknown or the ranks pace streams)."""
        known = self.capacity_model.known and not self.paced
        model = min(1.0, self.capacity_model.load(len(self.active))) if known else 1.0
        ends = []
        for s in self.active.values():
            pace = s.pace()
            ends.append(s.ends_in(self.expected_audio_s(s.spec), model if pace is None else pace, self.ttfa_s, now))
        return sorted(ends)

    def wait_s(self, now: float, ahead: int) -> float:
        """Seconds until a stream with ``ahead`` streams queued before it can start (inf: never, by estimate)."""
        over = len(self.active) + ahead - self.capacity() + 1  # streams that must end first
        if over <= 0:
            return 0.0
        frees = self.frees_in(now)
        return frees[over - 1] if over <= len(frees) else float("inf")

    # ---- decisions ----------------------------------------------------------------------------
    def decide(self, now: float) -> Decision:
        """For a new stream: run now, queue (it can start within the TTFA budget), or reject."""
        if len(self.active) < self.capacity() and not self.waiting:
            return Decision("run")
        wait = self.wait_s(now, len(self.waiting))
        if wait + self.ttfa_s <= self.ttfa_budget_s and len(self.waiting) < self.max_waiting:
            return Decision("queue")
        return Decision("reject", self.retry_after(now))

    def retry_after(self, now: float) -> float:
        """When a new stream could be admitted: the time until the first slot frees for it (at least 0.1 s)."""
        wait = self.wait_s(now, len(self.waiting))
        if wait == float("inf"):
            frees = self.frees_in(now)
            wait = frees[-1] if frees else DEFAULT_AUDIO_S
        return max(0.1, wait)

    def enqueue(self, spec: RequestSpec, now: float) -> None:
        self.waiting.append((spec, now))

    def next_ready(self) -> tuple[RequestSpec, float] | None:
        if self.waiting and len(self.active) < self.capacity():
            return self.waiting.popleft()
        return None

    def expired(self, now: float) -> list[RequestSpec]:
        """Waiting streams that can no longer start within the TTFA budget: removed, for a 429."""
        late = [spec for spec, queued in self.waiting if now - queued + self.ttfa_s > self.ttfa_budget_s]
        for spec in late:
            self.remove(spec.id)
        return late

    def remove(self, request_id: str) -> bool:
        for i, (spec, _) in enumerate(self.waiting):
            if spec.id == request_id:
                del self.waiting[i]
                return True
        return False

    # ---- what happens to admitted streams ---------------------------------------------------
    def start(self, spec: RequestSpec, now: float) -> None:
        self.active[spec.id] = Stream(spec, now)

    def produced(self, request_id: str, seconds: float, now: float) -> None:
        stream = self.active.get(request_id)
        if stream is not None:
            stream.add(seconds, now, len(self.active))

    def first_audio(self, seconds: float) -> None:
        """An admitted stream's time from admission to its first output (learned TTFA)."""
        self.ttfa_s = seconds if self.ttfa_s == 0.0 else (1 - EWMA) * self.ttfa_s + EWMA * seconds

    def end(self, request_id: str, ran_to_length: bool) -> None:
        """The stream finished (or failed, or was aborted): its slot frees; its length teaches the estimate."""
        stream = self.active.pop(request_id, None)
        if stream is None or stream.audio_s <= 0:
            return
        self.mean_audio_s = _ewma(self.mean_audio_s, stream.audio_s)
        max_tokens = stream.spec.sampling.max_tokens
        if ran_to_length and max_tokens:
            self.audio_per_token = _ewma(self.audio_per_token, stream.audio_s / max_tokens)


def _ewma(mean: float | None, sample: float) -> float:
    return sample if mean is None else (1 - EWMA) * mean + EWMA * sample
