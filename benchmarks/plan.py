"""``./dev bench plan``: does the planner's cost model rank placements the way they measure?

For a tiny-weight model (Orpheus by default; ``--model qwen3-omni`` for
Qwen3-Omni speech) on CPU ranks of this host: profile once (cached), let the
planner enumerate every placement that fits ``--devices`` and predict each
one's throughput, then serve the workload on each candidate and on the
hand-written placements shipped for the model, one after the other in this
run, and measure requests/s. Reported: predicted vs measured per placement,
the Spearman rank correlation over the candidates (of the simulation, which
chooses, and of the analytical bound, side by side), the pairs of candidates
every round measured in one order against the simulation's order (a pair whose
rounds disagree is within the machine's noise and counts neither way), and the planner's pick
against the best hand-written placement as a ratio. On a shared machine the
measurements are noisy: the report carries the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import conditions, table

SHIPPED = {"orpheus": ("orpheus-colocated", "orpheus-split"),
           "qwen3-omni": ("qwen3-omni", "qwen3-omni-split", "qwen3-omni-3way")}


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else 0.0


def pair_orders(predicted: list[float], rounds: list[list[float]]) -> tuple[int, int, int]:
    """Over every pair of placements: (pairs every round measured in the predicted order, pairs every round
    measured in the other order, pairs whose rounds disagree). The rounds go round-robin, so a pair's two
    measurements in one round saw about the same machine; a pair only counts as ordered when every round agrees."""
    agree = disagree = unresolved = 0
    for i in range(len(predicted)):
        for j in range(i + 1, len(predicted)):
            signs = {(a > b) - (a < b) for a, b in zip(rounds[i], rounds[j], strict=True)}
            want = (predicted[i] > predicted[j]) - (predicted[i] < predicted[j])
            if len(signs) != 1 or 0 in signs or want == 0:
                unresolved += 1
            elif signs == {want}:
                agree += 1
            else:
                disagree += 1
    return agree, disagree, unresolved


def checkpoint(family: str, root: Path) -> str:
    if family == "orpheus":
        from walkserve.models.orpheus.tiny import write_tiny_orpheus

        return str(write_tiny_orpheus(root / "orpheus", lm="tiny", snac="tiny", seed=3))
    from walkserve.models.qwen3_omni.tiny import write_tiny_qwen3_omni

    return str(write_tiny_qwen3_omni(root / "omni", seed=0, speech=True))


async def measure(model, data: dict, workload, requests: int) -> float:
    """Requests/s serving ``requests`` requests of the workload at its concurrency on ``data``."""
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.engine import AsyncEngine
    from walkserve.planner.profile import _run

    engine = await AsyncEngine.start(model, placement=data, config=RuntimeConfig())
    try:
        await _run(engine, workload.specs(engine.processor, 1))  # warm-up
        specs = workload.specs(engine.processor, requests)
        gate = asyncio.Semaphore(workload.concurrency)

        async def one(spec) -> None:
            async with gate:
                await _run(engine, [spec])

        t0 = time.perf_counter()
        await asyncio.gather(*(one(s) for s in specs))
        return requests / (time.perf_counter() - t0)
    finally:
        await engine.shutdown(drain_s=0)


def spread(ranked: list, n: int) -> list:
    """``n`` candidates evenly over the predicted ranking, the planner's pick first (all of them if fewer)."""
    if len(ranked) <= n:
        return list(ranked)
    step = (len(ranked) - 1) / (n - 1)
    return [ranked[round(i * step)] for i in range(n)]


def run(family: str, devices: str, requests: int, repeats: int, cache: Path | None, measured: int = 6,
        rounds: int = 3) -> dict:
    import yaml

    from walkserve.cli.placement_arg import placement_path
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model
    from walkserve.planner.devices import parse_devices
    from walkserve.planner.planning import costs_for, explain, plan
    from walkserve.planner.search import score_placement
    from walkserve.planner.workload import default_workload

    root = Path(tempfile.mkdtemp(prefix="bench-plan-"))
    model = load_model(ModelRef(family, checkpoint(family, root)))
    workload = default_workload(family, model.processor())
    costs = costs_for(model, workload, "cpu", None, cache, True, print, repeats=repeats)
    result = plan(model, parse_devices(devices), costs, workload)
    runs = []  # (kind, name, simulated, analytical bound, placement)
    for c in spread(result.ranked, measured):
        bound = score_placement(model.for_placement(c.data), costs, c.placement, workload.load, "bound").throughput
        runs.append(("candidate", c.name.replace(" | ", " / "), c.score.throughput, bound, c.data))  # a Markdown table
    for name in SHIPPED.get(family, ()):
        path = placement_path(name)
        data = yaml.safe_load(path.read_text())
        sim, bound = (explain(model, data, str(path), costs, workload.load, how).score.throughput
                      for how in ("simulate", "bound"))
        runs.append(("hand-written", name, sim, bound, data))
    seen: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):  # round-robin, so a burst of load on the machine hits every placement alike
        for i, run_ in enumerate(runs):
            seen[i].append(asyncio.run(measure(model, run_[-1], workload, requests)))
    rows = [(*run_[:-1], statistics.median(m), f"{min(m):.3g}-{max(m):.3g}") for run_, m in zip(runs, seen, strict=True)]
    cands = [r for r in rows if r[0] == "candidate"]
    hand = [r for r in rows if r[0] == "hand-written"]
    rho = {how: spearman([r[col] for r in cands], [r[4] for r in cands]) if len(cands) > 1 else float("nan")
           for how, col in (("simulated", 2), ("bound", 3))}
    picked = [i for i, r in enumerate(rows) if r[0] == "candidate"]
    pairs = pair_orders([rows[i][2] for i in picked], [seen[i] for i in picked])
    pick = cands[0][4]  # spread() keeps the planner's pick first
    best_hand = max((r[4] for r in hand), default=float("nan"))
    return {"rows": rows, "spearman": rho, "pairs": pairs, "pick_vs_best_hand": pick / best_hand if hand else float("nan"),
            "pick": result.winner.name, "why": result.why}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="orpheus", choices=["orpheus", "qwen3-omni"])
    p.add_argument("--devices", default="cpu:0-2", help="CPU ranks to plan for (default: %(default)s)")
    p.add_argument("--requests", type=int, default=16, help="requests per measured placement")
    p.add_argument("--repeats", type=int, default=2, help="profile runs per concurrency")
    p.add_argument("--profile-cache", type=Path, help="profile cache directory (default: the user's)")
    p.add_argument("--measure", type=int, default=6, help="candidates to serve, spread over the ranking (default: 6)")
    p.add_argument("--rounds", type=int, default=3, help="round-robin rounds over the placements; the median counts")
    args = p.parse_args(argv)
    load = os.getloadavg()
    out = run(args.model, args.devices, args.requests, args.repeats, args.profile_cache, args.measure, args.rounds)
    print(f"## plan: {args.model} on {args.devices} ({conditions()}; load average {load[0]:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end: measurements on a loaded machine are noisy)")
    print(table(["kind", "placement", "simulated req/s", "bound req/s", f"measured req/s (median of {args.rounds})",
                 "measured range"], out["rows"]))
    n = sum(r[0] == "candidate" for r in out["rows"])
    print(f"Spearman(predicted, measured) over {n} candidates: simulated {out['spearman']['simulated']:.2f}, "
          f"analytical bound {out['spearman']['bound']:.2f}")
    agree, disagree, unresolved = out["pairs"]
    print(f"pairs of candidates every round measured in one order: {agree} as simulated, {disagree} the other way; "
          f"{unresolved} pair(s) whose rounds disagree (within this machine's noise)")
    print(f"planner's pick {out['pick']}: {out['pick_vs_best_hand']:.2f}x the best hand-written placement (measured)")
    print(f"why: {out['why']}")
    return 0
