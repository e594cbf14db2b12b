"""``./dev bench tts --quick`` runs end to end (walkserve and the baseline) and prints its report."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADER = ("| system | conc. | requests | TTFA p50 ms | TTFA p95 ms | RTF p50 | audio s / wall s | x baseline "
          "| viability | codec batch | stopped early |")


@pytest.mark.slow
def test_quick_tts_benchmark_prints_the_table():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "tts", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert HEADER in out, out
    number = r"[\d.,]+"
    rows = re.findall(rf"^\| (walkserve|baseline) \| (\d+) \| (\d+) \| ({number}) \| ({number}) \| ({number}) \| "
                      rf"({number}) \| ([\d.,]+|nan) \| ([\d.]+)% \|", out, re.MULTILINE)
    assert sorted((s, int(c)) for s, c, *_ in rows) == [("baseline", 1), ("baseline", 3), ("walkserve", 1),
                                                        ("walkserve", 3)], out
    for system, conc, requests, ttfa50, ttfa95, rtf, throughput, ratio, viable in rows:
        assert int(requests) == int(conc)
        assert 0 < float(ttfa50.replace(",", "")) <= float(ttfa95.replace(",", ""))
        assert float(rtf) > 0 and float(throughput) > 0 and 0 <= float(viable) <= 100
        if system == "walkserve":
            assert float(ratio) > 0  # measured against the baseline at the same concurrency
    assert re.search(r"^- concurrency 3: [\d.]+x the baseline's audio throughput", out, re.MULTILINE), out
    assert re.search(r"^- concurrency 1: TTFA p50 \d+ ms vs target \d+ ms", out, re.MULTILINE), out


@pytest.mark.slow
def test_several_placements_run_in_one_command_a_row_each():
    """``--placement orpheus-split,orpheus-colocated``: both on the same requests, one after the other, each its row."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "tts", "--quick", "--concurrency", "1",
                           "--placement", "orpheus-split,orpheus-colocated"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rows = re.findall(r"^\| (walkserve [\w-]+|baseline) \| (\d+) \| (\d+) \| [\d.,]+ \|", out, re.MULTILINE)
    assert [(s, int(c), int(n)) for s, c, n in rows] == [("walkserve orpheus-split", 1, 1),
                                                         ("walkserve orpheus-colocated", 1, 1), ("baseline", 1, 1)], out
    assert "walkserve: 1 rounds on orpheus-split" in out and "walkserve: 1 rounds on orpheus-colocated" in out
