"""``./dev bench runtime``: what the runtime itself costs per loop step, and how much of a busy component it keeps busy.

1. Null engine: a two-node DynamicLoop (a -> b -> carry) whose engine does no
   work, B requests in lockstep; wall time per loop step = runtime overhead
   (receive, dataflow, compute-thread handoff, routing; plus a worker hop when
   a and b sit on two workers).
2. A component that burns ~5 ms of matmul per batch, 16 requests: tokens per
   second through the runtime vs calling the same component in a bare loop.
"""

from __future__ import annotations

import argparse
import time

from benchmarks.common import conditions, table
from walkserve.core.config import RuntimeConfig
from walkserve.core.request import RequestSpec
from walkserve.entrypoint.sync import Engine


def _placement(n: int, assign: dict[str, int]) -> dict:
    return {
        "ranks": [{"id": i, "device": "cpu"} for i in range(n)],
        "nodes": [{"nodes": [node], "ranks": [r]} for node, r in assign.items()],
    }


def _requests(batch: int, steps: int) -> list[RequestSpec]:
    return [RequestSpec({}, params={"steps": steps}) for _ in range(batch)]


def null_overhead(batch: int, workers: int, steps: int, threads: int) -> float:
    """Microseconds of wall time per loop step with B requests in lockstep."""
    assign = {"a": 0, "b": 0 if workers == 1 else 1}
    config = RuntimeConfig(max_running=max(256, batch), worker_threads=threads)
    with Engine.start("fixture-bench-null", placement=_placement(workers, assign), config=config) as engine:
        engine.run(_requests(batch, 10))  # warm up
        t0 = time.perf_counter()
        results = engine.run(_requests(batch, steps))
        elapsed = time.perf_counter() - t0
    assert all(len(r.events) == steps for r in results), "a request lost outputs"
    return elapsed / steps * 1e6


def compute_ratio(batch: int, steps: int, ms: float, threads: int) -> tuple[float, float, float]:
    """(bare items/s, runtime items/s, ratio)."""
    import torch

    from walkserve.engines.base import Firing
    from walkserve.testing.fixtures.bench import BurnComponent

    torch.set_num_threads(threads)
    comp = BurnComponent(ms)
    x = torch.ones(1, dtype=torch.int64)
    firings = [Firing(i, f"r{i}", "loop", "step", "step", "forward", (0,), {"x": x}, ("x",)) for i in range(batch)]
    comp.forward_batch(firings)
    t0 = time.perf_counter()
    for _ in range(steps):
        comp.forward_batch(firings)
    bare = batch * steps / (time.perf_counter() - t0)
    config = RuntimeConfig(max_running=max(256, batch), worker_threads=threads)
    with Engine.start("fixture-bench-compute", placement=_placement(1, {"step": 0}), config=config, model_options={"ms": ms}) as engine:
        engine.run(_requests(batch, 5))
        t0 = time.perf_counter()
        results = engine.run(_requests(batch, steps))
        served = batch * steps / (time.perf_counter() - t0)
    assert all(len(r.events) == steps for r in results), "a request lost outputs"
    return bare, served, served / bare


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench runtime", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    args = p.parse_args(argv)
    steps = 30 if args.quick else args.steps
    batches = (1, 16) if args.quick else (1, 16, 64)
    rows = []
    for workers in (1, 2):
        for b in batches:
            us = null_overhead(b, workers, steps, args.threads)
            rows.append((f"{workers}", b, us, us / b))
    print(f"## Runtime overhead (Null engine)\n\nconditions: {conditions()}; {steps} loop steps; worker threads {args.threads}\n")
    print(table(["workers", "batch", "µs per step", "µs per request-step"], rows))
    c_steps = 20 if args.quick else 100
    bare, served, ratio = compute_ratio(16, c_steps, 5.0, args.threads)
    print(f"\n## Busy component (~5 ms per batch), batch 16, {c_steps} steps\n")
    print(table(["bare loop items/s", "runtime items/s", "runtime / bare"], [(bare, served, ratio)]))
    print("\ntargets: overhead < 1000 µs per step at batch 64 on one worker; runtime / bare >= 0.9 at batch 16")
    return 0
