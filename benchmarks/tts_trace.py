"""StreamTrace: when each audio chunk of one request arrived, and the streaming metrics derived from it."""

from __future__ import annotations

from dataclasses import dataclass, field

SAMPLE_RATE = 24000


@dataclass
class StreamTrace:
    """One request's audio stream, times in seconds from its submission.

    ``chunks`` holds (arrival time, samples) in playback order. A listener
    starts playing at the first chunk; chunk k is *viable* when it (and every
    chunk before it) has arrived before the audio already delivered has
    finished playing: ``arrival_k <= arrival_0 + duration(chunks 0..k-1)``.
    """

    request: str
    chunks: list[tuple[float, int]] = field(default_factory=list)
    finished_s: float = float("nan")
    reason: str = ""
    extra: dict = field(default_factory=dict)

    def add(self, arrival_s: float, samples: int) -> None:
        if samples > 0:
            self.chunks.append((arrival_s, samples))

    def shifted(self, wait_s: float) -> StreamTrace:
        """The same stream had it waited ``wait_s`` in a queue before starting (a one-at-a-time server)."""
        chunks = [(t + wait_s, n) for t, n in self.chunks]
        return StreamTrace(self.request, chunks, self.finished_s + wait_s, self.reason, dict(self.extra))

    @property
    def samples(self) -> int:
        return sum(n for _, n in self.chunks)

    @property
    def audio_s(self) -> float:
        return self.samples / SAMPLE_RATE

    @property
    def ttfa_s(self) -> float:
        return self.chunks[0][0] if self.chunks else float("nan")

    @property
    def rtf(self) -> float:
        """Processing time over audio duration (below 1: faster than real time)."""
        return self.finished_s / self.audio_s if self.samples else float("nan")

    def gap_free(self, buffer_max_s: float = 1.0) -> bool:
        """The stream plays without an underrun: its listener starts at the first chunk after buffering
        min(TTFA, ``buffer_max_s``), and every later chunk arrives before the audio before it ran out."""
        if not self.chunks:
            return False
        start, played = self.chunks[0][0], 0.0
        buffer = min(buffer_max_s, start)
        for arrival, samples in self.chunks:
            if arrival > start + buffer + played + 1e-9:
                return False
            played += samples / SAMPLE_RATE
        return True

    def viable(self) -> tuple[int, int]:
        """(viable chunks, chunks)."""
        if not self.chunks:
            return 0, 0
        start, played, ok, ready = self.chunks[0][0], 0.0, 0, 0.0
        for arrival, samples in self.chunks:
            ready = max(ready, arrival)  # a chunk plays only after every earlier one arrived
            ok += ready <= start + played + 1e-9
            played += samples / SAMPLE_RATE
        return ok, len(self.chunks)
