"""``./dev bench bagel --quick`` runs end to end (the offline loop and walkserve)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_bagel_benchmark_prints_both_tables():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "bagel", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "| case | concurrency | images | p50 s | p95 s | images/min | x (ref) | check |" in out, out
    gen = re.findall(r"^\| walkserve bagel \| (\d) \| 2 \| [\d.]+ \| [\d.]+ \| ([\d.,]+) \| [\d.]+ \| 2/2 images as \(ref\) \|$",
                     out, re.MULTILINE)
    assert [c for c, _ in gen] == ["1", "2"] and all(float(r.replace(",", "")) > 0 for _, r in gen), out
    und = re.findall(r"^\| walkserve bagel \| 2 \| 2 \| ([\d.,]+) \| [\d.]+ \| 2/2 answers as \(ref\) \|$", out,
                     re.MULTILINE)
    assert len(und) == 1 and float(und[0].replace(",", "")) > 0, out
    assert "images/min at concurrency 1 =" in out and "tokens/s at concurrency 2 =" in out
