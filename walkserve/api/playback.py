"""PlaybackClock and StreamMeter: a real-time stream as its listener hears it, measured where chunks are written.

The playback clock starts when the first audio chunk is written to the
client. Chunk k is due when the audio written before it has finished playing,
plus a start-up buffer (the stream's time to first audio, at most
``buffer_max_s``: a player that buffered that long before starting). A chunk
written after its due time is a gap (an underrun) of ``late`` seconds; the
player then waits for it, so later due times move by the gap.

    written:   |c0|      |c1|          |c2|
    playback:  [== c0 ==][== c1 ==]....[== c2 ==]      .... = a gap
               ^ first chunk: the clock starts
"""

from __future__ import annotations

import logging
import time

from walkserve.api.metrics import ApiMetrics

log = logging.getLogger("walkserve.api.streams")


class PlaybackClock:
    def __init__(self, sample_rate: int, buffer_max_s: float, submitted_at: float):
        self.sample_rate, self.buffer_max_s, self.submitted_at = sample_rate, buffer_max_s, submitted_at
        self.start: float | None = None
        self.buffer_s = 0.0
        self.played_s = 0.0  # audio written so far, in seconds
        self.stall_s = 0.0  # gaps so far: playback waited this long in all
        self.gaps = 0

    def written(self, samples: int, now: float) -> float:
        """A chunk of ``samples`` was written at ``now``: how late it was (0.0: on time)."""
        if samples <= 0:
            return 0.0
        if self.start is None:
            self.start = now
            self.buffer_s = min(self.buffer_max_s, now - self.submitted_at)
            late = 0.0
        else:
            late = max(0.0, now - (self.start + self.buffer_s + self.played_s + self.stall_s))
        if late > 0:
            self.gaps += 1
            self.stall_s += late
        self.played_s += samples / self.sample_rate
        return late


class StreamMeter:
    """One real-time stream at the API: the active gauge, admitted or rejected, its gaps (logged once)."""

    def __init__(self, metrics: ApiMetrics, route: str, request_id: str, sample_rate: int, buffer_max_s: float):
        self.metrics, self.route, self.request_id = metrics, route, request_id
        self.clock = PlaybackClock(sample_rate, buffer_max_s, time.monotonic())
        self.admitted = False
        self.node = ""  # the node whose output is being written (the late one, when a chunk is late)
        metrics.streams_active.labels(route).inc()

    def on_event(self, node: str) -> None:
        if not self.admitted:
            self.admitted = True
            self.metrics.streams_admitted.labels(self.route).inc()
        if node:
            self.node = node

    def rejected(self, cause: str) -> None:
        self.metrics.streams_rejected.labels(self.route, cause).inc()

    def written(self, samples: int) -> None:
        late = self.clock.written(samples, time.monotonic())
        if late <= 0:
            return
        self.metrics.stream_gaps.labels(self.route).inc()
        self.metrics.stream_gap_seconds.labels(self.route).inc(late)
        if self.clock.gaps == 1:
            self.metrics.streams_with_gaps.labels(self.route).inc()
            log.warning("stream %s (%s): a gap of %.3f s after %.2f s of audio; the late chunk came from node %s",
                        self.request_id, self.route, late, self.clock.played_s, self.node or "unknown")

    def close(self) -> None:
        self.metrics.streams_active.labels(self.route).dec()
        if self.admitted:
            self.metrics.streams_ended.labels(self.route).inc()
