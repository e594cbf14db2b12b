"""The offline V-JEPA 2-AC rollout benchmark: both loops run and the token counts follow the horizon."""

from __future__ import annotations

from benchmarks.vjepa_offline import measure


def test_measure_reports_both_loops_per_horizon():
    rows = measure("tiny", horizons=(1, 3), repeat=1)
    assert [r["horizon"] for r in rows] == [1, 3]
    assert [(r["official_tokens"], r["cached_tokens"]) for r in rows] == [(18, 18), (108, 54)]
    assert all(r["official_s"] > 0 and r["cached_s"] > 0 and r["ratio"] > 0 for r in rows)
