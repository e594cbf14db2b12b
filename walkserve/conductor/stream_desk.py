"""StreamDesk: the conductor's side of real-time streams — their admission, their audio, the cost reports.

The conductor calls it at five moments: a stream is submitted (``decide``),
started (``started``), its audio leaves (``on_audio``), it ends (``ended``),
and a rank reports its counters (``on_rank_stats``). ``due_stats`` says when
to ask the ranks for fresh counters while streams run, so the step costs stay
current without anyone scraping /metrics.
"""

from __future__ import annotations

from walkserve.conductor.capacity import StreamCapacity
from walkserve.conductor.stream_admission import Decision, StreamAdmission
from walkserve.core.config import RuntimeConfig
from walkserve.core.request import RequestSpec
from walkserve.protocol import messages as m

STATS_EVERY_S = 0.5  # the ranks are asked for their counters this often while streams run


class StreamDesk:
    def __init__(self, config: RuntimeConfig):
        self.by_capacity = config.admission == "capacity"
        self.model = StreamCapacity(config.stream_headroom)
        self.admission = StreamAdmission(self.model, config.stream_ttfa_budget_s, config.max_streams,
                                         config.stream_warmup, config.max_waiting, config.stream_scheduling.by_deadline)
        self._asked = 0.0

    def decide(self, now: float) -> Decision:
        return self.admission.decide(now)

    def started(self, spec: RequestSpec, now: float) -> None:
        if spec.realtime:
            self.admission.start(spec, now)

    def on_audio(self, spec: RequestSpec, samples: int, first: bool, now: float, since_start: float) -> None:
        """Audio of a request left for the client (any request: every audio second teaches the costs)."""
        if spec.audio_rate <= 0 or samples <= 0:
            return
        seconds = samples / spec.audio_rate
        self.model.add_audio(seconds)
        if spec.realtime:
            self.admission.produced(spec.id, seconds, now)
            if first:
                self.admission.first_audio(since_start)

    def ended(self, request_id: str, ran_to_length: bool) -> None:
        self.admission.end(request_id, ran_to_length)

    def on_rank_stats(self, rank: int, stats: m.RankStats) -> None:
        self.model.observe(rank, stats.step_counts, stats.active_s)

    def due_stats(self, now: float) -> bool:
        """True (and the timer restarts) when the ranks should be asked for their counters now."""
        if not self.admission.active or now - self._asked < STATS_EVERY_S:
            return False
        self._asked = now
        return True

    def snapshot(self) -> dict[str, float]:
        """Gauges for RuntimeSnapshot.streams."""
        known = self.model.capacity()
        ceiling = self.admission.ceiling
        return {"running": len(self.admission.active), "waiting": len(self.admission.waiting),
                "capacity": float(self.admission.capacity()), "estimate": float(self.admission.estimate()),
                "capacity_measured": float(known is not None),
                "capped": float(ceiling is not None),
                "probed": float(self.admission.probe.above(self.admission.estimate())),
                "load": self.model.load(len(self.admission.active)) if known is not None and self.admission.active else 0.0}


def audio_samples(msg: m.ClientOuts) -> list[int]:
    """Samples per request of one ClientOuts of the audio modality (rows of ``stacked``, or each value)."""
    if msg.stacked is not None:
        per_row = 1
        for d in msg.stacked.shape[1:]:
            per_row *= d
        return [per_row] * len(msg.request_ids)
    return [_size(v) for v in msg.values]


def _size(value: m.Wire) -> int:
    if isinstance(value, m.TensorMsg):
        n = 1
        for d in value.shape:
            n *= d
        return n
    return len(value) if isinstance(value, list) else 0
