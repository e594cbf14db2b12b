"""RequestObserver: one request's timings into the app's histograms (TTFT, ITL, audio, RTF, e2e)."""

from __future__ import annotations

import time

from walkserve.api.metrics import ApiMetrics
from walkserve.core.array import ArrayData
from walkserve.core.outputs import OutputEvent, RequestFinished


class RequestObserver:
    def __init__(self, metrics: ApiMetrics, route: str, sample_rate: int | None):
        self.metrics = metrics
        self.route = route
        self.sample_rate = sample_rate
        self.t0 = time.monotonic()
        self.last_text: float | None = None
        self.first_audio: float | None = None
        self.audio_samples = 0

    def on_output(self, event: OutputEvent) -> None:
        now = time.monotonic()
        data = event.data
        if event.modality == "text":
            if self.last_text is None:
                self.metrics.ttft.labels(self.route).observe(now - self.t0)
            else:
                self.metrics.itl.labels(self.route).observe(now - self.last_text)
            self.last_text = now
            self.metrics.tokens.labels(self.route).inc(data.numel if isinstance(data, ArrayData) else 1)
        elif event.modality == "audio" and isinstance(data, ArrayData):
            if self.first_audio is None:
                self.first_audio = now
                self.metrics.ttfa.labels(self.route).observe(now - self.t0)
            self.audio_samples += data.numel

    def on_finish(self, finished: RequestFinished | None) -> None:
        elapsed = time.monotonic() - self.t0
        reason = str(finished.reason) if finished is not None else "abort"
        self.metrics.finished.labels(self.route, reason).inc()
        self.metrics.e2e.labels(self.route).observe(elapsed)
        queue = (finished.timings or {}).get("queue_s") if finished is not None else None
        if isinstance(queue, (int, float)):
            self.metrics.queue.labels(self.route).observe(max(0.0, float(queue)))
        if self.audio_samples and self.sample_rate:
            seconds = self.audio_samples / self.sample_rate
            self.metrics.audio_seconds.labels(self.route).inc(seconds)
            if finished is not None:
                self.metrics.rtf.labels(self.route).observe(elapsed / seconds)
