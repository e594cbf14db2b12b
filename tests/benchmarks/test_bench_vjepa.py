"""``./dev bench vjepa --quick`` runs every case end to end (the released loops and the served walks)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _rows(out: str, columns: int) -> list[list[str]]:
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")]
    return [r for r in cells if len(r) == columns and re.fullmatch(r"[\d,]+", r[0])]


@pytest.mark.slow
def test_quick_vjepa_benchmark_prints_every_table():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "vjepa", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "predictor width 64, 2 blocks" in out and "1 thread(s) per side" in out and "cores, torch" in out, out
    assert "| H | official ms | cached (offline) ms | walkserve ms | official / walkserve |" in out, out
    assert "load average (1, 5, 15 min) at the start" in out and "a forward +" in out, out
    rollouts, (throughput,), (plan,) = _rows(out, 12), _rows(out, 9), _rows(out, 7)
    assert [r[0] for r in rollouts] == ["2", "4"] and all(float(r[4]) > 0 and float(r[7]) > 0 for r in rollouts), out
    assert [r[5].split()[-1] for r in rollouts] == ["(4)", "(4)"], out  # rounds: 16 / H, at most 4 x --repeat 1
    assert [r[8] for r in rollouts] == ["1.51", "2.55"] and all(float(r[9]) > 0 for r in rollouts), out  # FLOP ratio
    assert throughput[:2] == ["2", "4"] and float(throughput[3]) > 0 and throughput[7] == "2.55", out
    assert float(throughput[5]) > 0, out  # official / the batched offline KV loop
    assert plan[:2] == ["8", "2"] and float(plan[5]) > 0, out


@pytest.mark.slow
def test_parts_pick_the_tables():
    """throughput and beside (a big plan with rollouts beside it; not a default part)."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "vjepa", "--quick", "--parts", "throughput,beside"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Rollout throughput" in proc.stdout and "Rollout latency" not in proc.stdout, proc.stdout
    assert "Plan latency" not in proc.stdout and len(_rows(proc.stdout, 9)) == 1, proc.stdout
    (beside,) = _rows(proc.stdout, 10)
    assert beside[:3] == ["512", "2", "1"] and int(beside[6]) >= 1 and float(beside[7]) > 0, proc.stdout
