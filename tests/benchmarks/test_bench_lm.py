"""``./dev bench lm --quick`` runs end to end (all four cases) and prints its report."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_lm_benchmark_prints_the_table():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "lm", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "| dtype | case | tokens/s | x (a) | x (c) | wall s | check |" in out
    rows = {m.group(1): float(m.group(2).replace(",", "")) for m in
            re.finditer(r"^\| float32 \| \(([abcd])\) [^|]+\| ([\d.,]+) \|", out, re.MULTILINE)}
    assert sorted(rows) == ["a", "b", "c", "d"] and all(v > 0 for v in rows.values()), out
    # the served model (d) generates exactly what its engine does in a bare loop (c)
    assert re.search(r"^\| float32 \| \(d\) .*\| 4/4 requests: same tokens as \(c\) \|$", out, re.MULTILINE), out
    assert re.search(r"^\| float32 \| \(d\) \| [\d.,]+ \| [\d.,]+ \| [\d.,]+ \| [\d.,]+ \| \d+ / \d+ \| 0 \|", out,
                     re.MULTILINE), out  # TTFT / ITL percentiles, KV blocks, no preemption
    assert "d/c = " in out and "d/a = " in out
    # served against bare from the (c), (d) pair, with the OpenMP wait every case ran with
    assert re.search(r"^\| float32 \| 1 \| 1 \| [\d.]+ \| [\d.]+-[\d.]+ \|", out, re.MULTILINE), out
    assert "- float32, 1 thread: served/bare = " in out and "OpenMP wait: " in out


@pytest.mark.slow
def test_quick_lm_step_benchmark_compares_every_variant_with_transformers():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "lm-step", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rows = re.findall(r"^\| (transformers|engine)[^|]*\| ([\d.,]+) \|[^|]+\|[^|]+\| ([\d.]+) \|([^|]*)\|$", out, re.MULTILINE)
    assert len(rows) == 4 and rows[0][0] == "transformers" and rows[0][2] == "1", out
    assert all(float(ms.replace(",", "")) > 0 for _, ms, _, _ in rows), out
    # every engine variant (previous kernels, default, packed) generates transformers' greedy tokens
    assert [agree.strip() for _, _, _, agree in rows[1:]] == ["4/4"] * 3, out
    assert "engine step / transformers forward = " in out
