"""How every rank orders ready work when streams compete (``RuntimeConfig.stream_scheduling``; docs/runtime.md)."""

from __future__ import annotations

from dataclasses import dataclass

from walkserve.core.errors import ConfigError

DEADLINE, FIFO = "deadline", "fifo"


@dataclass(frozen=True)
class StreamScheduling:
    """``mode``: ``deadline`` picks a step's members by least playback slack (streams about to gap, then
    first chunks, then deadline-free work by age), holds back streams far ahead of playback and caps a step
    at the engine's batch; ``fifo`` is the former behaviour: every ready member runs, in arrival order.

    ``urgent_slack_s``: a stream whose slack is below it is about to gap (it goes before first chunks).
    ``pace_slack_s``: a stream whose slack is above it waits while other work is ready (pacing).
    ``aging_s``: deadline-free work that waited this long goes first (nothing starves).
    ``startup_s``: the client's start-up buffer: audio plays this long after its first chunk arrived.
    """

    mode: str = DEADLINE
    urgent_slack_s: float = 0.25
    pace_slack_s: float = 1.0
    aging_s: float = 1.0
    startup_s: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in (DEADLINE, FIFO):
            raise ConfigError(f"stream_scheduling mode must be {DEADLINE!r} or {FIFO!r}, got {self.mode!r}")
        if self.pace_slack_s <= self.urgent_slack_s:
            raise ConfigError(f"pace_slack_s ({self.pace_slack_s}) must be above urgent_slack_s ({self.urgent_slack_s})")
        if self.aging_s <= 0 or self.startup_s < 0:
            raise ConfigError(f"aging_s must be > 0 and startup_s >= 0, got {self.aging_s}, {self.startup_s}")

    @property
    def by_deadline(self) -> bool:
        return self.mode == DEADLINE
