"""How much audio a node's firings add to a stream's playback (torch-free): declared per walk, read by the scheduler.

A streamed walk names, for each node on the path to the client's audio, a
``Playback``: the audio seconds one firing of that node is worth, and how its
firings group into the chunks the client hears. The runtime never looks inside
the audio; it only counts firings and reads these rates, so every rank on the
path (an LM decode step, a codec window, a talker frame) knows how much audio
a request has produced and when the next chunk is due (docs/runtime.md,
"Streams under load")::

    firings:  0 1 2 ... first-1 | first ... first+every-1 | ...
    chunks:   (none yet)        | chunk 0 (first_s)       | chunk 1 (every * audio_s) ...

Orpheus's LM: one token is 1/7 of a 2048-sample frame at 24 kHz, the first
chunk comes after 28 tokens and carries two frames, then one frame every 7
tokens: ``Playback(2048 / 24000 / 7, every=7, first=28, first_s=2 * 2048 / 24000)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from walkserve.core.errors import GraphError


@dataclass(frozen=True)
class Playback:
    """``audio_s`` seconds of audio per firing, heard in chunks of ``every`` firings; the first chunk after
    ``first`` firings (default ``every``) carries ``first_s`` seconds (default ``every * audio_s``)."""

    audio_s: float
    every: int = 1
    first: int | None = None
    first_s: float | None = None

    def __post_init__(self) -> None:
        if not self.audio_s > 0 or self.every < 1 or (self.first is not None and self.first < 1):
            raise GraphError(f"playback needs audio_s > 0, every >= 1 and first >= 1, got {self}")
        if self.first_s is not None and self.first_s <= 0:
            raise GraphError(f"playback first_s must be > 0, got {self.first_s}")

    @property
    def first_firings(self) -> int:
        return self.every if self.first is None else self.first

    @property
    def first_audio_s(self) -> float:
        return self.every * self.audio_s if self.first_s is None else self.first_s

    def chunks(self, fired: int) -> int:
        """Chunks complete after ``fired`` firings."""
        first = self.first_firings
        return 0 if fired < first else 1 + (fired - first) // self.every

    def audio_after(self, fired: int) -> float:
        """Seconds of audio the client has once ``fired`` firings' chunks arrived."""
        n = self.chunks(fired)
        return 0.0 if n == 0 else self.first_audio_s + (n - 1) * self.every * self.audio_s

    def to_next_chunk(self, fired: int) -> int:
        """Firings still to run, after ``fired``, until the next chunk is complete."""
        first = self.first_firings
        if fired < first:
            return first - fired
        return self.every - (fired - first) % self.every
