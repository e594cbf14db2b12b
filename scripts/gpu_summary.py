"""summary.md of a gpu_check run: conditions, the time of each part, parity, CUDA-graph speed-ups, FlashInfer's
cold start, the test counts and the benchmarks' verdict lines.

    python3 scripts/gpu_summary.py OUT_DIR ENV_FILE TIMES_FILE > OUT_DIR/summary.md
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def _table(headers: list[str], rows: list[list]) -> list[str]:
    fmt = lambda x: f"{x:.3g}" if isinstance(x, float) else str(x)  # noqa: E731
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + [
        "| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]


def _report(out: Path) -> list[dict]:
    path = out / "gpu_report.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def parity_lines(report: list[dict]) -> list[str]:
    checks = [r for r in report if "max_abs" in r]
    if not checks:
        return ["no parity measurement was recorded"]
    worst: dict[tuple[str, str], dict] = {}
    for r in checks:
        key = (re.sub(r" layer \d+$", "", r["what"]), r["dtype"])
        if key not in worst or r["max_abs"] > worst[key]["max_abs"]:
            worst[key] = r
    label = lambda r: "ok" if r["ok"] else "MISSED" if r.get("asserted", True) else "over (recorded only)"  # noqa: E731
    rows = [[what, dtype, r["max_abs"], r["rel"], r["scale"], r["limit"], label(r)]
            for (what, dtype), r in sorted(worst.items())]
    missed = sum(not r["ok"] and r.get("asserted", True) for r in checks)
    lines = [f"{len(checks)} comparisons, {missed} over an asserted limit (worst of each kind below)", "",
             *_table(["comparison", "dtype", "max |diff|", "relative", "max |ref|", "limit", ""], rows)]
    accuracy = [[r["what"], r["cuda_rel_to_fp32"], r["cpu_rel_to_fp32"], r["limit"], "ok" if r["ok"] else "MISSED"]
                for r in report if r.get("kind") == "bf16_accuracy"]
    if accuracy:
        lines += ["", "bf16 against the fp32 CPU result (relative error; asserted: CUDA <= 1.5 x CPU + 1e-3):", "",
                  *_table(["logits", "bf16 CUDA", "bf16 CPU", "limit", ""], accuracy)]
    return lines


def graph_lines(report: list[dict]) -> list[str]:
    rows = [[r["attention"], r["dtype"].removeprefix("torch."), r["batch"], r["eager_step_ms"], r["graph_step_ms"],
             r["speedup"]] for r in report if r.get("kind") == "cuda_graph_speedup"]
    if not rows:
        return ["no CUDA-graph timing was recorded"]
    return ["decode step of the tests' small Llama (4 layers, hidden 256), median of 10 steps, through the engine:", "",
            *_table(["attention", "dtype", "batch", "eager ms / step", "graph ms / step", "speed-up"], rows)]


def jit_lines(report: list[dict]) -> list[str]:
    rows = [r for r in report if r.get("kind") == "flashinfer_warmup"]
    if not rows:
        return ["FlashInfer's warm-up did not run"]
    out = []
    for r in rows:
        if "error" in r:
            out.append([r.get("head_dim", ""), "FAILED", "", r["error"][:160]])
        elif r["pass"] in ("import", "total"):
            out.append(["", r["pass"], r["s"], r.get("version", "")])
        else:
            out.append([r["head_dim"], f"{r['pass']} ({r['run']})", r["s"], ""])
    return _table(["head dim", "pass", "seconds", "note"], out)


def test_lines(out: Path) -> list[str]:
    log = out / "pytest.log"
    if not log.exists():
        return ["pytest did not run"]
    text = log.read_text()
    counts = re.findall(r"^=*\s*(\d+ (?:passed|failed|error|skipped|deselected).*?)\s*=*$", text, re.MULTILINE)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.MULTILINE)
    return [f"- {c}" for c in counts] + [f"- failed: `{f}`" for f in failed[:40]]


def bench_lines(out: Path) -> list[str]:
    lines = []
    for name in ("bench_lm.md", "bench_tts.md", "bench_more.md"):
        path = out / name
        if not path.exists():
            continue
        text = path.read_text()
        picked = [ln for ln in text.splitlines() if re.match(r"^- (float32|bfloat16|concurrency)", ln) or "MISSED" in ln
                  or "TIMED OUT" in ln or "Traceback" in ln or ln.startswith("== ")]
        lines += [f"`{name}`:", ""] + [f"    {ln}" for ln in picked] + [""]
    return lines or ["no benchmark ran"]


def main() -> int:
    out, env, times = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    report = _report(out)
    parts = [line.split("\t") for line in times.read_text().splitlines()] if times.exists() else []
    total = sum(int(p[1]) for p in parts if p[0] != "jit")
    lines = ["# walkserve GPU check", "", *(env.read_text().splitlines() if env.exists() else []), "",
             "## Parts", "", *_table(["part", "seconds", "exit"], [[p[0], int(p[1]), p[2]] for p in parts]),
             "", f"wall time of the foreground parts: {total} s (the FlashInfer build runs beside the CUDA tests)", "",
             "## pytest -m gpu", "", *test_lines(out), "", "## Parity (CUDA against CPU, same weights)", "",
             *parity_lines(report), "", "## CUDA-graph decode", "", *graph_lines(report), "",
             "## FlashInfer cold start (first use builds the kernels with nvcc; second is warm)", "",
             *jit_lines(report), "", "## Benchmarks (verdict lines; the full tables are in bench_*.md)", "",
             *bench_lines(out)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
