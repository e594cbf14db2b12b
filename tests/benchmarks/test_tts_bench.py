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


def test_one_placement_names_its_rows_walkserve_and_several_name_theirs():
    from benchmarks.tts import system_label

    assert system_label(["orpheus-split"], 0) == "walkserve"
    names = ["orpheus-split", "orpheus-colocated", "orpheus-split"]
    assert [system_label(names, i) for i in range(3)] == ["walkserve orpheus-split #1", "walkserve orpheus-colocated",
                                                          "walkserve orpheus-split #3"]


@pytest.mark.slow
def test_quick_tts_benchmark_prints_the_table_a_row_per_placement():
    """``./dev bench tts --quick --placement orpheus-split,orpheus-colocated``: both placements on the same requests,
    one after the other, each its rows, and the baseline's; the verdicts are the first placement's."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "tts", "--quick",
                           "--placement", "orpheus-split,orpheus-colocated"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert HEADER in out, out
    number = r"[\d.,]+"
    rows = re.findall(rf"^\| (walkserve [\w-]+|baseline) \| (\d+) \| (\d+) \| ({number}) \| ({number}) \| ({number}) \| "
                      rf"({number}) \| ([\d.,]+|nan) \| ([\d.]+)% \|", out, re.MULTILINE)
    assert [(s, int(c)) for s, c, *_ in rows] == [("walkserve orpheus-split", 1), ("walkserve orpheus-split", 3),
                                                  ("walkserve orpheus-colocated", 1), ("walkserve orpheus-colocated", 3),
                                                  ("baseline", 1), ("baseline", 3)], out
    for system, conc, requests, ttfa50, ttfa95, rtf, throughput, ratio, viable in rows:
        assert int(requests) == int(conc)
        assert 0 < float(ttfa50.replace(",", "")) <= float(ttfa95.replace(",", ""))
        assert float(rtf) > 0 and float(throughput) > 0 and 0 <= float(viable) <= 100
        if system != "baseline":
            assert float(ratio) > 0  # measured against the baseline at the same concurrency
    assert re.search(r"^- concurrency 3: [\d.]+x the baseline's audio throughput", out, re.MULTILINE), out
    assert re.search(r"^- concurrency 1: TTFA p50 \d+ ms vs target \d+ ms", out, re.MULTILINE), out
    assert "walkserve: 2 rounds on orpheus-split" in out and "walkserve: 2 rounds on orpheus-colocated" in out
