"""The playback clock of a real-time stream: gaps as its listener hears them."""

from __future__ import annotations

import pytest

from walkserve.api.playback import PlaybackClock

RATE = 1000  # samples per second: 500 samples = 0.5 s of audio


def test_chunks_in_time_are_no_gap_and_the_buffer_is_the_ttfa():
    clock = PlaybackClock(RATE, buffer_max_s=1.0, submitted_at=0.0)
    assert clock.written(500, 0.3) == 0.0  # first audio at 0.3 s: the listener buffered 0.3 s
    assert clock.written(500, 1.0) == 0.0  # due at 0.3 + 0.3 + 0.5 = 1.1
    assert clock.written(500, 1.55) == 0.0  # due at 1.6
    assert clock.gaps == 0 and clock.played_s == pytest.approx(1.5)


def test_a_late_chunk_is_a_gap_and_playback_resumes_from_it():
    clock = PlaybackClock(RATE, buffer_max_s=0.2, submitted_at=0.0)
    clock.written(500, 1.0)  # TTFA 1 s, but the buffer is at most 0.2 s
    assert clock.written(500, 1.8) == pytest.approx(0.1)  # due at 1.0 + 0.2 + 0.5 = 1.7
    assert clock.written(500, 2.25) == 0.0  # due 0.1 s later than before: 2.3
    assert clock.written(500, 3.0) == pytest.approx(0.2)
    assert clock.gaps == 2 and clock.stall_s == pytest.approx(0.3)


def test_an_empty_chunk_changes_nothing():
    clock = PlaybackClock(RATE, 1.0, 0.0)
    assert clock.written(0, 5.0) == 0.0 and clock.start is None
