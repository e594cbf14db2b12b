"""``./dev bench vjepa``: V-JEPA 2-AC rollouts and CEM planning served, against the released loops, in one run.

    ./dev bench vjepa [--preset bench] [--horizons 4,8,15,30] [--throughput-horizons 4,8,15] [--concurrency 8]
                      [--candidates 64] [--threads 1] [--repeat 3] [--parts rollout,throughput,plan] [--quick]

On a random-weight checkpoint (``walkserve tiny vjepa2-ac --preset bench``: predictor width 256, 8
blocks, 64 tokens per frame; encoder width 128, 2 blocks at a 128 crop), from one context frame:

1. rollout latency at each horizon, batch 1: the released loop (every step re-runs the predictor on the
   whole history), our offline KV-reusing loop, and the served rollout (placement vjepa2-ac); the ratio
   official / walkserve against the FLOP ratio (the target: 2.55 / 4.69 / 8.59 / 17.4 at H = 4 / 8 / 15
   / 30) and against the batch-1 ceiling on this machine (``vjepa_ceiling``: the FLOP ratio with the
   fixed cost of each predictor forward, fitted from bare forwards in the same run). The three run in
   interleaved rounds (order rotating), after a warm-up of each, so load from other processes weighs on
   all alike; short horizons get more rounds (``rounds_for``). Reported: median wall times, the median
   per-round ratio with its min-max, and the ratio of CPU seconds (this process and the worker ranks for
   walkserve: what the wall ratio is on an otherwise idle CPU), with the load average at the row's start
   and end;
2. rollout throughput at each of ``--throughput-horizons``: ``--concurrency`` rollouts at once, served,
   in predicted frames per second, against the released loop running them one after another, beside
   the FLOP ratio (concurrent rollouts share each predictor forward, which amortises its fixed cost)
   and beside the same rollouts stepping together offline (``vjepa_offline.batched_rollout``: dense
   caches, no paging, no serving; the model's own bound for the served case);
3. plan latency: one CEM iteration of ``--candidates`` candidates x horizon 2, served (one fanned
   append of K forked contexts a step) against each candidate rolled out alone (our offline planner,
   KV forks) and the released way (each candidate's whole history re-run);
4. ``beside`` (only when ``--parts`` names it): a big plan (``--beside-plan K,H,iterations``) served
   alone, then again with horizon-2 rollouts sent one after another while it runs: the rollouts'
   latency alone and beside the plan (median, max), and the plan's time alone and with them.

Each case includes encoding the context frame (and the goal) with the same encoder. Figures are medians
of ``--repeat`` runs (rollout latency: of ``rounds_for(H, repeat)`` rounds); the offline cases run in
this process, walkserve in its worker, each with ``--threads`` threads. ``--parts`` picks the tables.
``--quick`` (the tiny preset, small sizes) is the smoke test.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from benchmarks.common import conditions, table
from benchmarks.vjepa_cases import (
    Offline,
    Served,
    Work,
    actions_states,
    frames_of,
    median_time,
    timed,
)
from benchmarks.vjepa_ceiling import ForwardCost, ceiling, measure_forward_cost
from benchmarks.vjepa_offline import rollout_flops

PARTS = ("rollout", "throughput", "plan", "beside")
DEFAULT_PARTS = PARTS[:3]


def describe(path: Path) -> str:
    from walkserve.models.vjepa2.config import read_config

    c = read_config(path)
    e, p = c.encoder, c.predictor
    return (f"predictor width {p.hidden_size}, {p.num_hidden_layers} blocks, {p.num_attention_heads} heads, "
            f"{p.frame_tokens} tokens per frame ({p.tokens_per_step} per step); encoder width {e.hidden_size}, "
            f"{e.vit.num_hidden_layers} blocks, crop {e.crop_size}; random weights, {c.dtype}")


def rounds_for(h: int, repeat: int) -> int:
    """Short rollouts get more rounds (they are cheap and noisier): ``repeat`` x 16 / H, between repeat and 4 x."""
    return max(repeat, min(4 * repeat, math.ceil(repeat * 16 / h)))


def flop_ratio(path: Path, h: int) -> float:
    from walkserve.models.vjepa2.config import read_config

    cfg = read_config(path).predictor
    return rollout_flops(cfg, h, cached=False) / rollout_flops(cfg, h, cached=True)


def rollout_rows(offline: Offline, served: Served, work: Work, horizons: list[int]) -> tuple[list[list], ForwardCost]:
    """Per horizon, rounds of the three cases interleaved (the order rotating each round), so load that comes
    and goes weighs on all of them alike; medians of wall and CPU time, and the spread of the per-round ratio;
    beside them the FLOP ratio and the batch-1 ceiling (``vjepa_ceiling``) from this run's forward cost."""
    rows = []
    pixels = frames_of(work, 1, 0)
    actions, states = actions_states(horizons[0], horizons[0])
    offline.rollout(pixels, actions, states, horizons[0], cached=False)  # first calls: allocator, kernels
    cost = measure_forward_cost(offline.model, rounds=4 * work.repeat)
    encode = median_time(lambda: offline.features(pixels), 4 * work.repeat)
    for h in horizons:
        actions, states = actions_states(h, h)
        body = served.rollout_body(pixels, actions, states, h)
        served.run([body])  # warm-up
        offline.rollout(pixels, actions, states, h, cached=True)
        cases = {"official": (partial(offline.rollout, pixels, actions, states, h, cached=False), time.process_time),
                 "cached": (partial(offline.rollout, pixels, actions, states, h, cached=True), time.process_time),
                 "walkserve": (partial(served.run, [body]), served.cpu)}
        load0 = os.getloadavg()[0]
        runs = interleaved(cases, rounds_for(h, work.repeat))
        wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        per_round = [o[0] / s[0] for o, s in zip(runs["official"], runs["walkserve"])]
        ratio, flops = statistics.median(per_round), flop_ratio(work.path, h)
        top = ceiling(offline.model.config, h, wall["official"], encode, cost)
        rows.append([h, 1e3 * wall["official"], 1e3 * wall["cached"], 1e3 * wall["walkserve"], ratio,
                     f"{min(per_round):.2f}-{max(per_round):.2f} ({len(per_round)})", wall["official"] / wall["cached"],
                     cpu["official"] / cpu["walkserve"], flops, top, ratio / top,
                     f"{load0:.1f}-{os.getloadavg()[0]:.1f}"])
    return rows, cost


def interleaved(cases: dict[str, tuple], rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds of each case per round; the order of the cases rotates each round."""
    order = list(cases)
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            runs[name].append(timed(*cases[name]))
    return runs


def throughput_row(offline: Offline, served: Served, work: Work, h: int, concurrency: int) -> list:
    """``concurrency`` rollouts served at once against the released loop running them one after another, in
    ``--repeat`` interleaved rounds: predicted frames per second (median wall), the ratio by wall and CPU time."""
    cases = [(frames_of(work, 1, 10 + i), *actions_states(h, 10 + i)) for i in range(concurrency)]
    bodies = [served.rollout_body(px, a, s, h) for px, a, s in cases]
    served.run(bodies[:2])  # warm-up
    load0 = os.getloadavg()[0]
    offline.batched(cases[:2], h)  # warm-up
    runs = interleaved({"official": (partial(_one_after_another, offline, cases, h), time.process_time),
                        "walkserve": (partial(served.run, bodies), served.cpu),
                        "batched": (partial(offline.batched, cases, h), time.process_time)}, work.repeat)
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    frames = concurrency * h
    return [concurrency, h, frames / wall["official"], frames / wall["walkserve"], wall["official"] / wall["walkserve"],
            wall["official"] / wall["batched"], cpu["official"] / cpu["walkserve"], flop_ratio(work.path, h),
            f"{load0:.1f}-{os.getloadavg()[0]:.1f}"]


def _one_after_another(offline: Offline, cases: list[tuple], h: int) -> None:
    for px, a, s in cases:
        offline.rollout(px, a, s, h, cached=False)


def plan_row(offline: Offline, served: Served, work: Work, samples: int, h: int = 2) -> list:
    pixels, goal = frames_of(work, 1, 100), frames_of(work, 1, 101)
    _, states = actions_states(1, 100)
    body = served.plan_body(pixels, goal, states, samples, h)
    served.run([body])  # warm-up
    t = {"official": median_time(lambda: offline.plan(pixels, goal, states, samples, h, official=True), 1),
         "forks": median_time(lambda: offline.plan(pixels, goal, states, samples, h, official=False), work.repeat),
         "walkserve": median_time(lambda: served.run([body]), work.repeat)}
    return [samples, h, 1e3 * t["official"], 1e3 * t["forks"], 1e3 * t["walkserve"], t["official"] / t["walkserve"],
            t["forks"] / t["walkserve"]]


def beside_row(served: Served, work: Work, samples: int, h: int, iterations: int) -> list:
    """A plan of ``samples`` x ``h`` x ``iterations`` alone, then with horizon-2 rollouts one after another
    beside it (as many as it lasts): rollout latency alone and beside it, the plan's time alone and with them."""
    return served.loop.run_until_complete(_beside(served, work, samples, h, iterations))


async def _beside(served: Served, work: Work, samples: int, h: int, iterations: int) -> list:
    import asyncio

    async def timed_one(body: tuple) -> float:
        t0 = time.perf_counter()
        await served._one(*body)
        return time.perf_counter() - t0

    _, states = actions_states(1, 100)
    plan = served.plan_body(frames_of(work, 1, 100), frames_of(work, 1, 101), states, samples, h, iterations)
    small = served.rollout_body(frames_of(work, 1, 0), *actions_states(2, 0), 2)
    load0 = os.getloadavg()[0]
    alone = [await timed_one(small) for _ in range(5)]
    plan_alone = await timed_one(plan)
    task = asyncio.ensure_future(timed_one(plan))
    beside = []
    while not task.done():
        beside.append(await timed_one(small))
    return [samples, h, iterations, 1e3 * statistics.median(alone), 1e3 * statistics.median(beside),
            1e3 * max(beside), len(beside), plan_alone, await task, f"{load0:.1f}-{os.getloadavg()[0]:.1f}"]


def report(path: Path, work: Work, loads: tuple[str, str], parts: dict[str, object]) -> str:
    lines = [f"V-JEPA 2-AC served, {describe(path)}; 1 context frame; {work.threads} thread(s) per side, median of "
             f"{work.repeat}; {conditions()}; load average (1, 5, 15 min) at the start {loads[0]}, at the end "
             f"{loads[1]}"]
    if "rollout" in parts:
        rows, cost = parts["rollout"]
        lines += ["", "Rollout latency, batch 1 (encode the frame + H predicted frames):",
                  table(["H", "official ms", "cached (offline) ms", "walkserve ms", "official / walkserve",
                         "per round: min-max (rounds)", "official / cached", "CPU s: official / walkserve",
                         "FLOP ratio", "batch-1 ceiling", "walkserve / ceiling", "load (1 min)"], rows),
                  "(rounds interleaved, medians; the target is the FLOP ratio, judged on the wall-time ratio; CPU "
                  "time counts the serving processes, worker ranks included; ceiling: the FLOP ratio with each "
                  f"forward's fixed cost, fitted from bare predictor forwards in this run: {cost.describe()})"]
    if "throughput" in parts:
        lines += ["", "Rollout throughput, concurrent rollouts (predicted frames per second):",
                  table(["rollouts", "H", "official frames/s (one after another)", "walkserve frames/s",
                         "x official", "official / batched KV (offline)", "CPU s: official / walkserve",
                         "FLOP ratio", "load (1 min)"], parts["throughput"]),
                  "(--repeat rounds, official, walkserve and the batched KV loop interleaved, medians; batched KV: "
                  "the same rollouts stepping together offline, dense caches, no serving: the model's own bound)"]
    if "plan" in parts:
        lines += ["", "Plan latency, one CEM iteration (encode frame and goal + K candidates x H steps):",
                  table(["candidates", "H", "official ms", "KV forks (offline) ms", "walkserve ms",
                         "official / walkserve", "forks / walkserve"], [parts["plan"]])]
    if "beside" in parts:
        lines += ["", "A big plan and small rollouts beside it (horizon-2 rollouts sent one after another while it runs):",
                  table(["candidates", "H", "iterations", "rollout alone ms", "rollout beside: median ms", "max ms",
                         "rollouts", "plan alone s", "plan beside them s", "load (1 min)"], [parts["beside"]])]
    return "\n".join(lines)


def _loads() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench vjepa", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="bench", choices=["tiny", "bench"])
    p.add_argument("--horizons", default="4,8,15,30", help="comma-separated horizons (<= 32)")
    p.add_argument("--throughput-horizons", default="4,8,15", help="horizons of the throughput table")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--candidates", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS), help="which tables: rollout, throughput, plan, beside")
    p.add_argument("--beside-plan", default="4096,2,2", help="the beside table's plan: candidates,horizon,iterations")
    p.add_argument("--quick", action="store_true",
                   help="the tiny preset, horizons 2,4, 2 rollouts, 8 candidates (beside: 512,2,1)")
    args = p.parse_args(argv)
    if args.quick:
        args.preset, args.horizons, args.throughput_horizons = "tiny", "2,4", "4"
        args.concurrency, args.candidates, args.repeat, args.beside_plan = 2, 8, 1, "512,2,1"
    horizons = [int(h) for h in args.horizons.split(",")]
    parts = [x for x in args.parts.split(",") if x]
    if set(parts) - set(PARTS):
        p.error(f"--parts takes {', '.join(PARTS)}")
    from walkserve.models.vjepa2.tiny import write_tiny_vjepa2_ac

    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_vjepa2_ac(Path(tmp) / f"vjepa2-ac-{args.preset}", preset=args.preset)
        from walkserve.models.vjepa2.config import read_config

        work = Work(path, args.threads, args.repeat, read_config(path).encoder.crop_size)
        start, results = _loads(), {}
        offline, served = Offline(work), Served.start(work, "vjepa2-ac")
        try:
            if "rollout" in parts:
                results["rollout"] = rollout_rows(offline, served, work, horizons)
            if "throughput" in parts:
                results["throughput"] = [throughput_row(offline, served, work, int(h), args.concurrency)
                                         for h in args.throughput_horizons.split(",")]
            if "plan" in parts:
                results["plan"] = plan_row(offline, served, work, args.candidates)
            if "beside" in parts:
                results["beside"] = beside_row(served, work, *(int(x) for x in args.beside_plan.split(",")))
        finally:
            served.close()
        print(report(path, work, (start, _loads()), results))
    return 0
