"""``./dev bench omni-thinker --quick`` runs end to end (the reference and both placements)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_omni_benchmark_prints_the_table():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "omni-thinker", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "| case | concurrency | tokens/s | x (ref) | TTFT p50 ms |" in out, out
    served = re.findall(r"^\| walkserve (qwen3-omni\S*) \| 2 \| ([\d.,]+) \|.*\| (\d+)% \| 2 \| 2/2 same tokens as \(ref\) \|$",
                        out, re.MULTILINE)
    assert sorted(name for name, _, _ in served) == ["qwen3-omni", "qwen3-omni-encoders-split"], out
    assert all(float(tps.replace(",", "")) > 0 and int(share) > 0 for _, tps, share in served), out
    assert "tokens/s at concurrency 2 =" in out and "TTFT at concurrency 2 =" in out
