"""``./dev bench lm``'s served/bare table: ratios from (c), (d) pairs and the per-step figures beside them."""

from __future__ import annotations

from benchmarks.lm_cases import CaseResult
from benchmarks.lm_ratio import Pairs, report


def _run(seconds: float, cpu: float, wait: float, load: float, runtime: tuple[float, float] | None = None) -> CaseResult:
    extra = {"steps": 10, "process_cpu_s": cpu, "wait_s": wait, "load": load}
    if runtime:
        extra["cpu_s"] = {"conductor": runtime[0], "client": runtime[1]}
    return CaseResult("x", [[1] * 50, [2] * 50], seconds, extra=extra)  # 100 tokens


def test_each_served_run_is_compared_with_the_bare_run_before_it():
    pairs = Pairs("float32", 2, (
        (_run(1.0, 1.8, 0.1, 0.5), _run(1.25, 1.8, 0.2, 0.6, (0.01, 0.02))),  # 0.8
        (_run(2.0, 1.9, 0.9, 3.0), _run(2.0, 2.0, 1.0, 3.1, (0.02, 0.03))),  # 1.0
        (_run(1.0, 2.0, 0.1, 0.7), _run(1.05, 2.2, 0.1, 0.8, (0.01, 0.01))),  # 1/1.05
    ))
    assert [round(r, 3) for r in pairs.ratios()] == [0.8, 1.0, 0.952]
    lines = report([pairs, Pairs("float32", 1, ())])  # a setting without pairs gets no row
    rows = [row for line in lines for row in line.splitlines() if row.startswith("| float32")]
    assert rows == ["| float32 | 2 | 3 | 0.952 | 0.80-1.00 | 100 | 125 | 190.0 / 200.0 | 10.0 / 20.0 | 3 | 0.50-3.10 |"]
    summary = lines[-1]
    assert summary.startswith("- float32, 2 threads: served/bare = 0.95, median of 3 pairs (target >= 0.9 at 2 threads: met)")
    assert "CPU per step is 1.05x the bare loop's" in summary
    assert "10.0 ms per step bare, 20.0 served" in summary and "conductor + client CPU 3.0 ms per step" in summary


def test_a_ratio_under_the_target_at_two_threads_is_flagged_and_other_counts_have_no_target():
    slow = (_run(1.0, 1.0, 0.0, 0.1), _run(2.0, 1.0, 0.0, 0.1, (0.0, 0.0)))
    assert "(target >= 0.9 at 2 threads: MISSED)" in report([Pairs("float32", 2, (slow,))])[-1]
    assert "target" not in report([Pairs("float32", 1, (slow,))])[-1]
    assert report([]) == []
