"""The load sweep's pieces that need no server: arrival schedules, gap-free streams, the SVG."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from benchmarks.tts_load import Level, Sweep, schedules
from benchmarks.tts_plot import sweep_svg
from benchmarks.tts_trace import StreamTrace

FRAME = 2048  # samples: 85.3 ms at 24 kHz


def test_schedules_offer_load_times_capacity_then_a_burst():
    sweep = Sweep(frames=24, seconds=200.0, loads=(0.5, 2.0), burst=3.0)
    levels = schedules(sweep, capacity=4)
    assert [name for name, _, _ in levels] == ["0.5x", "2x", "burst 3x"]
    for _, load, times in levels[:2]:
        rate = load * 4 / sweep.audio_s  # streams per second
        assert times == sorted(times) and all(0 <= t < sweep.seconds for t in times)
        assert len(times) == pytest.approx(rate * sweep.seconds, rel=0.15)
    assert levels[2][2] == [0.0] * 12
    assert schedules(sweep, 4) == levels  # seeded: both modes get the same arrivals


def test_gap_free_allows_the_start_up_buffer_and_nothing_more():
    on_time = StreamTrace("a", [(0.5, FRAME), (0.9, FRAME), (1.0, FRAME)])  # due 0.5 + min(0.5, 1) + played
    assert on_time.gap_free()
    late = StreamTrace("b", [(0.2, FRAME), (0.2 + 0.2 + FRAME / 24000 + 0.01, FRAME)])  # 10 ms past its due time
    assert not late.gap_free() and not late.gap_free(buffer_max_s=5.0)  # the buffer is at most the TTFA (0.2 s)
    assert StreamTrace("c", [(0.2, FRAME), (0.45, FRAME)]).gap_free(buffer_max_s=0.2)
    assert not StreamTrace("empty").gap_free()


def test_the_svg_has_both_modes_and_every_level():
    levels = []
    for mode, viable in (("capacity+deadline", True), ("count+fifo", False)):
        for name in ("1x", "burst 4x"):
            lv = Level(mode, name, 1.0, 2, wall_s=1.0)
            chunks = [(0.1, FRAME), (0.15, FRAME)] if viable else [(0.1, FRAME), (5.0, FRAME)]
            lv.traces.append(StreamTrace(f"{mode}{name}", chunks))
            levels.append(lv)
    svg = sweep_svg(levels, "caption <here>")
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "capacity+deadline" in texts and "count+fifo" in texts and "caption <here>" in texts
    assert texts.count("burst 4x") == 2  # one axis label per panel
    assert len(list(root.iter("{http://www.w3.org/2000/svg}polyline"))) == 4  # 2 panels x 2 modes
    assert levels[0].viability() == 1.0 and levels[2].viability() == 0.0
    assert levels[0].goodput() == pytest.approx(2 * FRAME / 24000) and levels[2].goodput() == 0.0


def test_the_http_rejection_line_gives_the_percentiles_and_names_answers_that_were_not_429():
    from benchmarks.http_rejections import Rejections

    r = Rejections(3, statuses=[429, 429, 200], reject_ms=[2.0, 4.0], health_ms=[1.0, 1.0, 3.0])
    line = r.line()
    assert "3 streams over capacity" in line and "while 3 streams played" in line
    assert "p50 3.0 ms, p99 4.0 ms" in line and "/health between them p50 1.0 ms" in line and "not 429: [200]" in line
    assert "not 429" not in Rejections(1, [429], [2.0], [1.0]).line()
