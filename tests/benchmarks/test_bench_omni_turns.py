"""``./dev bench omni-turns`` on three short turns: every answer the same with and without reuse, and the
follow-up turns prefill fewer rows with it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_omni_turns_benchmark_shows_follow_ups_prefilling_less():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = ["--turns", "3", "--seconds", "1.5", "--new-tokens", "4"]
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "omni-turns", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rows = re.findall(r"^\| (\d) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|.*\| (same|DIFFERENT) \|$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["1", "2", "3"], out
    for turn, prompt, new, off, on, reused, answer in rows:
        assert answer == "same" and int(off) == int(prompt) and int(on) + int(reused) == int(prompt), out
        if turn != "1":  # the earlier turns come from the cache: what runs is the new rows and one block at most
            assert int(reused) > 0 and int(on) < int(new) + 16, out


@pytest.mark.slow
def test_omni_turns_benchmark_spoken_follow_ups_keep_their_clips():
    """--speak: each follow-up answers its earlier clips from the capture cache and prefills as a text one does."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = ["--turns", "3", "--seconds", "1.5", "--new-tokens", "4", "--speak"]
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "omni-turns", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rows = re.findall(r"^\| (\d) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|.*\| (same|DIFFERENT) \|$", out,
                      re.MULTILINE)
    assert [r[0] for r in rows] == ["1", "2", "3"], out
    for turn, prompt, new, off, on, reused, kept, answer in rows:
        # the last prompt row is a one-row firing (not a prefill)
        assert answer == "same" and int(off) == int(prompt) - 1 and int(on) + int(reused) == int(prompt) - 1, out
        assert int(kept) == int(turn) - 1, out  # every earlier turn's clip
        if turn != "1":
            assert int(reused) > 0 and int(on) < int(new) + 16, out
