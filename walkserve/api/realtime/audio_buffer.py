"""AudioBuffer: the input audio appended since the last commit (pcm16 24 kHz), on the session's time line."""

from __future__ import annotations

from walkserve.api.errors import ApiError
from walkserve.api.realtime.session_config import RATE


def ms(samples: int) -> int:
    return samples * 1000 // RATE


class AudioBuffer:
    def __init__(self, max_seconds: float):
        self.max_bytes = int(max_seconds * RATE) * 2
        self.pcm = bytearray()
        self.start = 0  # session position (samples) of pcm[0]

    @property
    def end(self) -> int:
        return self.start + len(self.pcm) // 2

    def append(self, pcm: bytes) -> None:
        if len(self.pcm) + len(pcm) > self.max_bytes:
            seconds = self.max_bytes / 2 / RATE
            raise ApiError(400, f"the input audio buffer holds at most {seconds:g} s; commit or clear it first",
                           "audio", "input_audio_buffer_full")
        self.pcm += pcm

    def keep_from(self, position: int) -> None:
        """Drop what lies before ``position`` (silence before speech, beyond the prefix padding)."""
        cut = max(0, min(position, self.end) - self.start)
        del self.pcm[: cut * 2]
        self.start += cut

    def take(self, position: int | None = None, end: int | None = None) -> bytes:
        """The audio from ``position`` (default: all of it) to ``end`` (default: the end); the buffer then holds
        only what lies after ``end``."""
        if position is not None:
            self.keep_from(position)
        stop = self.end if end is None else max(self.start, min(end, self.end))
        pcm = bytes(self.pcm[: (stop - self.start) * 2])
        self.keep_from(stop)
        return pcm

    def clear(self) -> None:
        self.start = self.end
        self.pcm.clear()
