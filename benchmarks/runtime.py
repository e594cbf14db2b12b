"""``./dev bench runtime``: what the runtime itself costs per loop step, and how much of a busy component it keeps busy.

1. Null engine: a two-node DynamicLoop (a -> b -> carry) whose engine does no
   work, B requests in lockstep; wall time per loop step = runtime overhead
   (receive, executor, routing, client outputs through conductor and frontend;
   plus a worker hop each way when a and b sit on two workers).
2. Streamed loop, Null engine: an LM-shaped DynamicLoop feeding a
   SlidingWindow(28, 7) stream that a codec node reads per window (Orpheus's
   shape), B requests on one worker.
3. A component that burns ~5 ms of matmul per batch, 16 requests: items per
   second through the runtime vs calling the same component in a bare loop;
   the same for a nested loop (an outer step, then 15 inner steps: the
   Qwen3-Omni talker with its code predictor), against a bare loop making the
   same 16 calls per outer step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import replace
from typing import NamedTuple

from benchmarks.common import conditions, table
from walkserve.core.config import RuntimeConfig
from walkserve.core.request import RequestSpec
from walkserve.entrypoint.sync import Engine
from walkserve.testing.fixtures.base import FixtureParams


def _placement(n: int, assign: dict[str, int]) -> dict:
    return {
        "ranks": [{"id": i, "device": "cpu"} for i in range(n)],
        "nodes": [{"nodes": [node], "ranks": [r]} for node, r in assign.items()],
    }


def _requests(batch: int, steps: int) -> list[RequestSpec]:
    return [RequestSpec({}, params=FixtureParams(steps=steps)) for _ in range(batch)]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process, all its threads (Linux /proc); None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _processes(engine: Engine) -> dict[str, int]:
    """The runtime's processes by role: its workers ("rank N"), its conductor, and this one (the frontend)."""
    ranks = {f"rank {r}": pid for r, pid in sorted(engine.status.stats.pids.items())}
    return {**ranks, "conductor": engine.engine.process.pid, "frontend": os.getpid()}


def _cpu_now(procs: dict[str, int]) -> dict[str, float] | None:
    """CPU seconds each process of ``procs`` has used so far; None when one cannot be read (off Linux, or gone)."""
    secs = {role: cpu_seconds(pid) for role, pid in procs.items()}
    return None if None in secs.values() else secs


async def _streamed(engine, requests: list[RequestSpec]) -> list[int]:
    """Consume every request through its own ``generate`` stream (as the HTTP server does); events per request."""
    from walkserve.core.outputs import OutputEvent

    async def one(request: RequestSpec) -> int:
        return sum([isinstance(out, OutputEvent) async for out in engine.generate(request)])

    return list(await asyncio.gather(*(one(r) for r in requests)))


def windows(steps: int, window: int = 28, stride: int = 7) -> int:
    """Chunks SlidingWindow(window, stride) makes of ``steps`` items, the flushed tail included."""
    if steps < window:
        return 1
    full = 1 + (steps - window) // stride
    return full + (1 if (steps - window) % stride else 0)


def start(family: str, workers: int, threads: int, **overrides) -> Engine:
    """A runtime for ``family`` with its two nodes on one worker or on two (``overrides``: RuntimeConfig fields)."""
    nodes = ("a", "b") if family == "fixture-bench-null" else ("lm", "codec")
    config = replace(RuntimeConfig(max_running=256, worker_threads=threads), **overrides)
    return Engine.start(family, placement=_placement(workers, {nodes[0]: 0, nodes[1]: workers - 1}), config=config)


def _outputs_per_request(family: str, steps: int) -> int:
    return steps if family == "fixture-bench-null" else windows(steps)


def null_overhead(
    batch: int, workers: int, steps: int, threads: int, repeat: int = 3, streams: bool = False,
    family: str = "fixture-bench-null",
) -> tuple[list[float], dict[str, float]]:
    """``overhead_on`` a runtime of its own."""
    with start(family, workers, threads, max_running=max(256, batch)) as engine:
        return overhead_on(engine, family, batch, steps, repeat, streams)


def overhead_on(
    engine: Engine, family: str, batch: int, steps: int, repeat: int = 3, streams: bool = False,
) -> tuple[list[float], dict[str, float]]:
    """Wall µs per loop step with B requests in lockstep (one value per measured run), and CPU µs per step by process.

    The outputs are gathered by ``Engine.run`` (one submission, events collected into lists),
    or with ``streams`` through one ``generate`` stream per request, as the HTTP server reads them.

    A full-size run goes first, unmeasured: the first few hundred steps after start-up run
    slower (freshly forked workers touching their pages, caches filling), which is not the
    steady state this measures. The CPU figures cover all measured runs: the worker
    processes (summed), the conductor, and this process (the frontend: the in-process
    API's event loop, which receives every output).
    """
    want = _outputs_per_request(family, steps)
    runs = []
    procs = _processes(engine)

    def run_once() -> list[int]:
        requests = _requests(batch, steps)
        if streams:
            return asyncio.run_coroutine_threadsafe(_streamed(engine.engine, requests), engine.loop).result()
        return [len(r.events) for r in engine.run(requests)]

    run_once()  # warm up
    before = _cpu_now(procs)
    for _ in range(repeat):
        t0 = time.perf_counter()
        counts = run_once()
        runs.append((time.perf_counter() - t0) / steps * 1e6)
        assert counts == [want] * batch, "a request lost outputs"
    after = _cpu_now(procs)
    if before is None or after is None:
        return runs, {}
    used = {role: (after[role] - before[role]) / (repeat * steps) * 1e6 for role in procs}
    workers = sum(v for role, v in used.items() if role.startswith("rank "))
    return runs, {"workers": workers, "conductor": used["conductor"], "frontend": used["frontend"]}


def compute_ratio(batch: int, steps: int, ms: float, threads: int, repeat: int = 3, nested: bool = False) -> tuple[float, float, float]:
    """(bare items/s, runtime items/s, ratio): medians of ``repeat`` alternating runs; an item is one request's step."""
    import torch

    from walkserve.engines.base import Firing
    from walkserve.engines.stateless import component_batch
    from walkserve.testing.fixtures.bench import INNER_STEPS, BurnComponent

    torch.set_num_threads(threads)
    x = torch.ones(1, dtype=torch.int64)
    if nested:
        family, assign = "fixture-bench-nested", {"talker": 0, "predictor": 0}
        talker, predictor = BurnComponent(ms), BurnComponent(ms, "c", "c")
        outer = component_batch([Firing(i, f"r{i}", "loop", "talker", "talker", "forward", (0,), {"x": x}, ("x",))
                                 for i in range(batch)])
        inner = component_batch([Firing(i, f"r{i}", "loop", "predictor", "predictor", "forward", (0, 0),
                                        {"x": x, "c": x}, ("c",))
                                 for i in range(batch)])
        calls = [(talker, outer)] + [(predictor, inner)] * INNER_STEPS
    else:
        family, assign = "fixture-bench-compute", {"step": 0}
        comp = BurnComponent(ms)
        calls = [(comp, component_batch([Firing(i, f"r{i}", "loop", "step", "step", "forward", (0,), {"x": x}, ("x",))
                                         for i in range(batch)]))]
    for comp, items in calls[:2]:
        comp.forward_batch(items)
    config = RuntimeConfig(max_running=max(256, batch), worker_threads=threads)
    bare_runs, served_runs = [], []
    with Engine.start(family, placement=_placement(1, assign), config=config, model_options={"ms": ms}) as engine:
        engine.run(_requests(batch, steps))  # warm up
        for _ in range(repeat):  # alternate, so both see the same machine
            t0 = time.perf_counter()
            for _ in range(steps):
                for comp, items in calls:
                    comp.forward_batch(items)
            bare_runs.append(batch * steps / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            results = engine.run(_requests(batch, steps))
            served_runs.append(batch * steps / (time.perf_counter() - t0))
            assert all(len(r.events) == steps for r in results), "a request lost outputs"
    bare, served = statistics.median(bare_runs), statistics.median(served_runs)
    return bare, served, served / bare


def _overhead_rows(args: argparse.Namespace, steps: int, repeat: int) -> list[tuple]:
    """One runtime per fixture and worker count, measured one at a time; its rows' batches and clients in turn."""
    batches = (1, 16) if args.quick else (1, 16, 64)
    runtimes = [("loop", 1, [(b, False) for b in batches] + [(batches[-1], True)]),
                ("loop", 2, [(b, False) for b in batches]),
                ("streamed loop", 1, [(batches[-1], False)])]
    rows = {}
    for what, workers, measured in runtimes:
        family = "fixture-bench-null" if what == "loop" else "fixture-bench-stream"
        with start(family, workers, args.threads) as engine:
            for b, streams in measured:
                runs, cpu = overhead_on(engine, family, b, steps, repeat=repeat, streams=streams)
                mid = statistics.median(runs)
                shares = [cpu.get(role, float("nan")) for role in ("workers", "conductor", "frontend")]
                client = "streams" if streams else "run"
                rows[what, workers, streams, b] = (what, f"{workers}", b, client, mid, min(runs), max(runs), mid / b, *shares)
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0] != "loop", k[2], k[1], k[3]))]


HALVES = 16  # split_steps of the row whose split loop sends each step in two halves


class Pair(NamedTuple):
    """One batch of ``pair_rounds``: medians of wall µs per step, and CPU µs per step of each process over the rounds."""

    colocated: float
    split: float
    ratio: float  # the median of the rounds' split / colocated
    colocated_cpu: dict[str, float]  # "rank 0", "conductor", "frontend" -> CPU µs per step ({} off Linux)
    split_cpu: dict[str, float]  # "rank 0", "rank 1", "conductor", "frontend"


def pair_rounds(engines: tuple[Engine, Engine], family: str, batch: int, steps: int, rounds: int) -> Pair:
    """Colocated against split wall µs per step (medians over ``rounds``), with each process's CPU per step.

    ``engines``: the fixture's two nodes on one worker, and on two (``start``). Both runtimes
    are up at once and their rounds alternate, so both see the same machine; the ratio is the
    median of each round's split time over the colocated round just before it. Each round's
    CPU is read before and after it, so a runtime's figures cover its own rounds only (the
    frontend, this process, serves both, one round at a time).
    """
    want = _outputs_per_request(family, steps)
    times: tuple[list[float], list[float]] = ([], [])
    procs = [_processes(engine) for engine in engines]
    used = [dict.fromkeys(p, 0.0) for p in procs]  # CPU seconds by role, over the runtime's rounds
    readable = [True, True]  # /proc could be read around every round
    for engine in engines:
        engine.run(_requests(batch, steps))  # warm up
    for _ in range(rounds):
        for i, (engine, runs) in enumerate(zip(engines, times)):
            before = _cpu_now(procs[i])
            t0 = time.perf_counter()
            counts = [len(r.events) for r in engine.run(_requests(batch, steps))]
            runs.append((time.perf_counter() - t0) / steps * 1e6)
            after = _cpu_now(procs[i])
            if before is None or after is None:
                readable[i] = False
            else:
                for role in procs[i]:
                    used[i][role] += after[role] - before[role]
            assert counts == [want] * batch, "a request lost outputs"
    ratio = statistics.median(s / c for c, s in zip(*times))
    per_step = [{role: secs / (rounds * steps) * 1e6 for role, secs in u.items()} if ok else {}
                for u, ok in zip(used, readable)]
    return Pair(statistics.median(times[0]), statistics.median(times[1]), ratio, *per_step)


def cpu_bound(split_cpu: dict[str, float], cores: int) -> float:
    """The least wall µs per step any schedule of this much CPU work can take on ``cores`` cores: every process's
    CPU per step over the cores, or the busiest process's alone when that is more (a process runs its
    heartbeat on one thread)."""
    return max(sum(split_cpu.values()) / cores, max(split_cpu.values()))


def _split_rows(args: argparse.Namespace, steps: int) -> list[tuple[str, int, Pair]]:
    """Each fixture's colocated runtime stays up while its split runtimes (one per config) come and go."""
    batches = (1, 16) if args.quick else (1, 16, 64)
    rounds = 2 if args.quick else 5
    configs = {  # family -> [(row, split runtime's RuntimeConfig overrides, batches)]
        "fixture-bench-null": [("loop", {}, batches), ("loop, in halves", {"split_steps": HALVES}, batches[-1:]),
                               ("loop, over ZeroMQ", {"direct_peers": False}, batches[-1:])],
        "fixture-bench-stream": [("streamed loop", {}, batches[-1:])],
    }
    rows = []
    for family, splits in configs.items():
        with start(family, 1, args.threads) as colocated:
            for what, overrides, bs in splits:
                with start(family, 2, args.threads, **overrides) as split:
                    rows += [(what, b, pair_rounds((colocated, split), family, b, steps, rounds)) for b in bs]
    return rows


def _cpu_table(split: list[tuple[str, int, Pair]]) -> str:
    """The split rows' CPU per step by process, and the least step time that much CPU allows on this machine."""
    cores = os.cpu_count() or 1
    rows = []
    for what, b, p in split:
        if not p.split_cpu or not p.colocated_cpu:
            continue
        c, s = p.colocated_cpu, p.split_cpu
        bound = cpu_bound(s, cores)
        rows.append((what, b, c["rank 0"], c["conductor"], c["frontend"], s["rank 0"], s["rank 1"], s["conductor"],
                     s["frontend"], bound, bound / p.colocated))
    if not rows:
        return "\n(CPU by process is read from /proc: not on this system.)"
    head = ["fixture", "batch", "colocated: worker", "conductor", "frontend", "split: rank 0", "rank 1", "conductor",
            "frontend", f"split's CPU bound on {cores} cores, µs per step", "bound / colocated µs per step"]
    return (f"\n## Where the split's step goes: CPU µs per step by process, the same rounds\n\n{table(head, rows)}\n\n"
            f"User + system time of each process over its runtime's rounds, per loop step (clock-tick resolution). "
            f"The bound: no schedule of the split's work can take less wall time per step than all its processes' "
            f"CPU over the {cores} cores, nor less than its busiest process's; the ranks of a loop that hands its carry "
            f"back every step also take turns, so a whole step takes about rank 0 + rank 1. A bound / colocated "
            f"above 2 says the split does too much CPU work per step for 2x on this machine, however it is scheduled.")


def _transport_table(split: list[tuple[str, int, Pair]], quick: bool) -> str:
    """The split loop's step against the colocated step plus only the hand-over and back, per batch."""
    from benchmarks.runtime_floor import core_pairs, transport_rows  # it imports this module

    loop = {b: (p.colocated, p.ratio) for what, b, p in split if what == "loop"}
    trips, rounds = (300, 2) if quick else (2000, 5)
    rows = transport_rows(loop, trips, rounds)
    places = ["one core" if c is not None and c[0] == c[1] else "two cores" if c is not None else "unpinned"
              for c in core_pairs()]
    head = ["batch", "frame to rank 1, bytes", "frame back, bytes", *[f"round trip, {p}, µs" for p in places],
            "colocated µs per step", f"(colocated + round trip, {places[-1]}) / colocated", "split / colocated, measured"]
    return (f"\n## The split's floor on the wire: the colocated step plus one step handed over and back\n\n"
            f"{table(head, rows)}\n\nThe frames of one mid-run step of the split loop each way, as the executors "
            f"encode them (``step_frames``), sent between two processes through the workers' inboxes and datagram "
            f"links, decoded on arrival (``round_trip``: the minimum of {rounds} runs' means of {trips} round trips, "
            f"each side pinned where the column says). A split in whole steps does the colocated step's node work "
            f"one rank after the other and hands the step over and back: with nothing else added it would take the "
            f"colocated step plus the round trip. What the measured split takes beyond that is the executors' work "
            f"of the hand-off (the in-process floor below).")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench runtime", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--hosts", type=int, default=1, choices=(1, 2),
                   help="2: ranks on two Ray nodes of a local cluster against one host (needs walkserve[ray])")
    p.add_argument("--payload-mib", type=float, default=8.0, help="with --hosts 2: the tensor a sends b per step")
    args = p.parse_args(argv)
    if args.hosts == 2:
        from benchmarks.runtime_hosts import report

        return report(args.quick, args.steps, args.threads, args.payload_mib)
    steps = 30 if args.quick else args.steps
    repeat = 1 if args.quick else 3
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    rows = _overhead_rows(args, steps, repeat)
    runs_note = "one measured run" if args.quick else "median, min and max of 3 measured runs after a full-size warm-up run"
    print(f"## Runtime overhead (Null engine)\n\nconditions: {conditions()}; load average {load} (1/5/15 min) at the start; "
          f"{steps} loop steps; worker threads {args.threads}; {runs_note}\n")
    print(table(["fixture", "workers", "batch", "client", "µs per step", "min", "max", "µs per request-step",
                 "CPU µs/step: workers", "conductor", "frontend"], rows))
    print("\nCPU columns: user + system time of each process over the measured runs, per loop step "
          f"(all threads; the workers summed over ranks; frontend = this process, its event loop "
          f"receives every output; clock-tick resolution). With {os.cpu_count()} cores the three "
          f"together can use at most {os.cpu_count()}x the wall time. Client: run = Engine.run (one "
          f"submission, events gathered into lists); streams = one generate() stream per request, "
          f"as the HTTP server reads them. Streamed loop: lm ~> SlidingWindow(28, 7) ~> codec, the "
          f"codec's 2,048-sample frames to the client.")
    split_load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    split = _split_rows(args, steps)
    print(f"\n## Split over two workers against colocated (load average {split_load} at the start, "
          f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())} at the end)\n")
    print(table(["fixture", "batch", "colocated µs per step", "split µs per step", "split / colocated"],
                [(what, b, p.colocated, p.split, p.ratio) for what, b, p in split]))
    print(f"\nBoth runtimes up at once, {2 if args.quick else 5} alternating rounds of {steps} steps each "
          f"after a warm-up; medians; the ratio is the median of the rounds' ratios. Loop: a on rank 0, b on "
          f"rank 1 (the carry and the stop rule's decision go back each step); in halves: "
          f"RuntimeConfig(split_steps={HALVES}); over ZeroMQ: RuntimeConfig(direct_peers=False), the workers' "
          f"frames through ZeroMQ rather than datagram sockets; streamed loop: lm on rank 0, codec on rank 1.")
    print(_cpu_table(split))
    print(_transport_table(split, args.quick))
    from benchmarks.runtime_floor import wire_floor, wire_opcode_sites, wire_opcodes

    floor_steps, floor_rounds = (30, 2) if args.quick else (100, 5)
    floor = [(b, *wire_floor(b, floor_steps, floor_rounds), *wire_opcodes(b, 5 if args.quick else 20))
             for b in ((1, 16) if args.quick else (1, 16, 64))]
    print("\n## The same loop with both ranks in one process (the split's floor)\n")
    print(table(["batch", "colocated CPU µs per step", "split CPU µs per step", "split / colocated",
                 "colocated opcodes per step", "split opcodes per step", "split / colocated"], floor))
    print(f"\nThe executors stepped in lockstep, every frame between the ranks through the real wire path "
          f"(wire.pack, the codec, wire.unpack_message, Executor.receive), no processes or sockets; thread CPU time "
          f"(the load does not enter), the minimum of {floor_rounds} alternating runs of {floor_steps} steps; the "
          f"simulated conductor's side included in both. The ranks take turns (the carry and the decision go back "
          f"every step), so a real split step takes at least its two ranks' share of this CPU, one after the other. "
          f"Opcodes: Python bytecode executed per step (sys.settrace, a run of n steps subtracted from one of 3n), "
          f"counted, so the load does not move it; what torch and the codec do in C is not in it.")
    site_batch = 16 if args.quick else 64
    sites = wire_opcode_sites(site_batch, 5 if args.quick else 20, 12)
    print(f"\n## Where the split's extra Python goes: opcodes per step by function, batch {site_batch}\n")
    print(table(["function (file:line name)", "colocated", "split", "split - colocated"], sites))
    print("\nThe same count as above, by the function that ran each opcode: the twelve the split raises most. "
          "Per-member loops of the hand-off show as about batch x their per-member opcodes.")
    c_steps = 20 if args.quick else 100
    n_steps = 4 if args.quick else 20
    busy = [("flat loop", c_steps, *compute_ratio(16, c_steps, 5.0, args.threads, repeat=repeat)),
            ("nested loop (1 + 15 calls per step)", n_steps, *compute_ratio(16, n_steps, 5.0, args.threads, repeat=repeat, nested=True))]
    busy_note = "one run each" if args.quick else "medians of 3 alternating runs each, after a warm-up run"
    print(f"\n## Busy component (~5 ms per call), batch 16; {busy_note}\n")
    print(table(["loop", "outer steps", "bare loop items/s", "runtime items/s", "runtime / bare"], busy))
    print("\ntargets: overhead <= 1000 µs per step at batch 64 on one worker (loop and streamed loop), "
          "<= 2000 µs split over two workers; split / colocated <= 2 for the loop at batch 64; "
          "runtime / bare >= 0.9 at batch 16 (flat and nested)")
    return 0
