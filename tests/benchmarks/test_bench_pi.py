"""``./dev bench pi --quick --device cpu`` (as ``scripts/gpu_check.sh --dry-run`` calls it) runs end to end:
transformers' PI0 and walkserve at both concurrencies."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_pi_benchmark_prints_the_table_and_the_ratios():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "pi", "--quick", "--device", "cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "| system | c=1 p50 ms | c=1 p95 ms | c=1 chunks/s | c=8 p50 ms | c=8 p95 ms | c=8 chunks/s |" in out, out
    for system in ("transformers PI0 (one at a time)", "walkserve"):
        row = re.search(rf"^\| {re.escape(system)} \|(( [\d.,]+ \|){{6}})$", out, re.MULTILINE)
        assert row is not None, out
        assert all(float(v.replace(",", "")) > 0 for v in row.group(1).split("|") if v.strip()), out
    assert re.search(r"concurrency 1: p50 [\d.]+x, p95 [\d.]+x the reference's latency", out), out
    assert re.search(r"concurrency 8: [\d.]+x the reference's chunks per second", out), out
    assert re.search(r"walkserve compute prefix [\d.]+ ms, flow [\d.]+ ms", out), out
    # every request's 10 flow steps share the expert calls with the others' at c=8: more than one per call
    batch = re.search(r"expert batch: ([\d.]+) requests .* at c=1, ([\d.]+) requests", out)
    assert batch is not None, out
    assert float(batch.group(1)) == 1.0 and float(batch.group(2)) > 1.5, out
    # the prefixes of requests that arrive together share PaliGemma forwards and SigLIP calls; every column has
    # fresh observations, so none finds another's prefix in the cache
    prefix = re.search(r"prefix batch: ([\d.]+) requests per PaliGemma forward, ([\d.]+) per SigLIP call at c=1; "
                       r"([\d.]+) and ([\d.]+) at c=8; prefix rows from the prefix cache: (\d+)% at c=1, (\d+)% at c=8", out)
    assert prefix is not None, out
    assert float(prefix.group(1)) == 1.0 and float(prefix.group(3)) > 1.0 and float(prefix.group(4)) > 1.0, out
    assert prefix.group(5) == prefix.group(6) == "0", out
    cpu = re.search(r"CPU time per chunk: reference ([\d.]+) ms, walkserve ([\d.]+) ms at c=1 and ([\d.]+) ms", out)
    assert cpu is not None and all(float(v) > 0 for v in cpu.groups()), out
    assert re.search(r"so a chunk takes >= [\d.]+ ms of CPU and the throughput ratio is at most [\d.]+x", out), out
    assert re.search(r"so even with a free flow the throughput ratio is at most [\d.]+x", out), out
    assert "load average" in out, out


@pytest.mark.slow
def test_quick_pi_benchmark_with_repeated_observations_reuses_prefixes():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "pi", "--quick", "--requests", "16", "--repeats", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "each robot's observation changes every 2 chunk(s)" in out, out
    share = re.search(r"prefix rows from the prefix cache: (\d+)% at c=1, (\d+)% at c=8", out)
    assert share is not None and int(share.group(1)) > 0 and int(share.group(2)) > 0, out
    assert "(were every prefix computed; here the caches skip the unchanged ones)" in out, out
