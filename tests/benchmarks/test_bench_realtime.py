"""``./dev bench realtime --quick`` runs end to end and prints both sides, the cancellation latency and the
prefill-while-speaking table (on vs off per utterance length). The speech goes at 4x real time (``--speed 4``):
the table's figures are the bench's business, its rows and their plumbing the test's, and 24 s of the run
were the client waiting to send the next 100 ms."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_realtime_benchmark_prints_the_table():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "realtime", "--quick", "--speed", "4"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "turns of 1, 2 s sent at 4x real-time pace" in out and "speech at 4x real time" in out, out
    assert "| utterance | realtime p50 ms | realtime p99 ms | chat p50 ms | chat p99 ms | realtime / chat p50 |" in out, out
    rows = re.findall(r"^\| (\d) s \(turn \d\) \| ([\d,]+) \| [\d,]+ \| ([\d,]+) \| [\d,]+ \| [\d.]+ \|$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["1", "2"], out
    assert all(int(r[1].replace(",", "")) > 0 and int(r[2].replace(",", "")) > 0 for r in rows), out
    cancel = re.search(r"cancellation \(response.cancel -> response.done cancelled\): p50 (\d+) ms, p99 \d+ ms over [1-4] "
                       r"responses", out)
    assert cancel and int(cancel.group(1)) > 0, out
    assert ("| utterance | audio on p50 ms | audio off p50 ms | audio on / off | text on p50 ms | text off p50 ms | "
            "text on / off | rows on | rows off |") in out, out
    prefill = re.findall(r"^\| (\d) s \| ([\d,.]+) \| ([\d,.]+) \| [\d.]+ \| ([\d,.]+) \| ([\d,.]+) \| [\d.]+ \| "
                         r"(\d+) \| (\d+) \|$", out, re.MULTILINE)
    assert [r[0] for r in prefill] == ["1", "3"], out
    assert all(float(v.replace(",", "")) > 0 for r in prefill for v in r[1:]), out
