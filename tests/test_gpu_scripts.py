"""The GPU check's pieces that run without a GPU: the wheel list and the summary of a run's files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_list_pins_one_version_of_each_package():
    lines = [ln for ln in (ROOT / "scripts" / "gpu_wheels.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    names = [ln.split("==")[0].lower().replace("_", "-") for ln in lines]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][A-Za-z0-9.]*", ln) for ln in lines), lines
    assert len(set(names)) == len(names) and {"flashinfer-python", "apache-tvm-ffi", "msgspec", "pyzmq"} <= set(names)


def test_the_summary_reads_every_file_of_a_run(tmp_path):
    report = [
        {"test": "t1", "what": "attention decode layer 0", "dtype": "bfloat16", "max_abs": 0.004, "rel": 0.002,
         "scale": 3.0, "limit": 0.02, "ok": True},
        {"test": "t1", "what": "attention decode layer 1", "dtype": "bfloat16", "max_abs": 0.03, "rel": 0.01,
         "scale": 3.0, "limit": 0.02, "ok": False},
        {"test": "t2", "kind": "cuda_graph_speedup", "attention": "flashinfer", "dtype": "torch.bfloat16", "batch": 16,
         "eager_step_ms": 9.0, "graph_step_ms": 3.0, "speedup": 3.0},
        {"kind": "flashinfer_warmup", "pass": "import", "s": 1.5, "version": "0.6.4"},
        {"kind": "flashinfer_warmup", "head_dim": 64, "pass": "decode", "run": "first", "s": 95.0},
        {"kind": "flashinfer_warmup", "head_dim": 128, "error": "RuntimeError('nvcc failed')"},
    ]
    (tmp_path / "gpu_report.jsonl").write_text("".join(json.dumps(r) + "\n" for r in report) + "not json\n")
    (tmp_path / "pytest.log").write_text("FAILED tests/gpu/x.py::test_y - boom\n1 failed, 40 passed, 2 skipped in 80.1s\n")
    (tmp_path / "bench_lm.md").write_text("== bench-lm (cap 150s)\n| table |\n- bfloat16: e/b = 3.40 (target >= 3: met)\n")
    env, times = tmp_path / ".env", tmp_path / ".times"
    env.write_text("- nvidia-smi: NVIDIA H200, 143771 MiB\n")
    times.write_text("install\t4\t0\njit\t120\t0\ntests-cuda\t90\t1\nbench-lm\t60\tskipped\n")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_summary.py"), str(tmp_path), str(env), str(times)],
                         capture_output=True, text=True, check=True).stdout
    assert "NVIDIA H200" in out and "| tests-cuda | 90 | 1 |" in out and "| bench-lm | 60 | skipped |" in out
    assert "wall time of the foreground parts: 154 s" in out
    assert "2 comparisons, 1 over an asserted limit" in out and "| attention decode | bfloat16 | 0.03 |" in out
    assert "| flashinfer | bfloat16 | 16 | 9 | 3 | 3 |" in out
    assert "| 64 | decode (first) | 95 |" in out and "FAILED" in out and "nvcc failed" in out
    assert "- 1 failed, 40 passed, 2 skipped in 80.1s" in out and "- failed: `tests/gpu/x.py::test_y`" in out
    assert "    - bfloat16: e/b = 3.40 (target >= 3: met)" in out
