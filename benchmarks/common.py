"""Shared helpers: machine conditions, percentiles, and a Markdown table for the report."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence


def conditions(device: str = "cpu") -> str:
    import torch

    text = (
        f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, python {platform.python_version()}"
    )
    if device.startswith("cuda") and torch.cuda.is_available():
        text += f"; {gpu_conditions(torch.device(device))}"
    return text


def gpu_conditions(device) -> str:
    """GPU name, memory, driver, CUDA runtime and FlashInfer version (the conditions of a GPU figure)."""
    import subprocess

    import torch

    props = torch.cuda.get_device_properties(device)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = "unknown"
    try:
        import flashinfer

        fi = flashinfer.__version__
    except ImportError:
        fi = "not installed"
    return (f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs), driver {driver}, "
            f"CUDA {torch.version.cuda}, flashinfer {fi}")


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def fmt(x: object) -> str:
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
        return str(x)

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
