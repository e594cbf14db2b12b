"""The runtime benchmark's Null-engine measurement: every output arrives, and CPU is split by process."""

from __future__ import annotations

import sys

import pytest

from benchmarks.runtime import cpu_seconds, null_overhead


def test_null_overhead_measures_wall_and_cpu_per_process():
    runs, cpu = null_overhead(batch=4, workers=2, steps=100, threads=1, repeat=2)
    assert len(runs) == 2 and all(r > 0 for r in runs)
    if sys.platform != "linux":
        pytest.skip("CPU by process is read from /proc")
    assert set(cpu) == {"workers", "conductor", "frontend"}
    # 2 runs x 4 requests x 100 steps x 2 nodes: 1,600 firings went through the workers: they cannot have used no CPU at all
    assert cpu["workers"] > 0 and all(v >= 0 for v in cpu.values())


def test_null_overhead_through_per_request_streams_counts_every_output():
    runs, _ = null_overhead(batch=3, workers=1, steps=40, threads=1, repeat=1, streams=True)
    assert len(runs) == 1 and runs[0] > 0  # null_overhead asserts every request got all 40 outputs


def test_cpu_seconds_of_a_process_that_is_gone_is_none():
    assert cpu_seconds(2**22 + 12345) is None
