"""``./dev bench omni --quick`` runs end to end (transformers' generate(return_audio=True) and walkserve)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_speech_benchmark_prints_the_table():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "omni", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "| case | concurrency | audio s / wall s | x (ref) | audio s / CPU s | TTFA p50 ms |" in out, out
    ref = re.search(r"^\| \(ref\) transformers, 1 at a time \| 1 \| ([\d.,]+) \| 1 \| [\d.,]+ \|", out, re.MULTILINE)
    served = re.search(r"^\| walkserve qwen3-omni \| 2 \| ([\d.,]+) \| [\d.,]+ \| [\d.,]+ \| ([\d,]+) \|.*\| (\d+)% / (\d+)% / "
                       r"(\d+)% \| 2/2 codes equal \|$", out, re.MULTILINE)
    assert ref and served, out
    assert float(ref.group(1)) > 0 and float(served.group(1).replace(",", "")) > 0
    assert all(int(served.group(k)) > 0 for k in (3, 4, 5)), out  # every partition did work
    assert "audio s per wall s at concurrency 2 =" in out
    assert re.search(r"TTFA at concurrency 2, answers of >= 25 frames: p50 \d+ ms against .* chunk \(\d+ ms\): p50 \d+ ms; \d/\d within", out), out
    assert "- (ref) transformers, 1 at a time: our processes " in out and "rank 0 (" in out, out  # where the wall time went
