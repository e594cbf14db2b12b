"""Shared helpers: machine conditions, percentiles, and a Markdown table for the report."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence


def conditions() -> str:
    import torch

    return (
        f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, python {platform.python_version()}"
    )


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
