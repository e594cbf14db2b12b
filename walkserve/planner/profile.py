"""``walkserve profile``: measure each node's step cost by serving the workload with every node on one rank.

The model runs through the real runtime (``AsyncEngine``) on one rank of the
device kind, so the costs include what the engines and the executor really do
per step. For each thread count (a CPU rank's share of the host's cores) and
each concurrency, the workload's requests run at once and the runtime's
per-node counters (steps, items, busy seconds) give one sample per node: the
mean batch and the seconds per step (``costs.NodeCost``, which keeps the fastest repeat
of each concurrency; the repeats go round-robin over the concurrencies, so a burst of other work on the host
slows one repeat of a level, not every one). A lone request's
time until it has begun every output stream it makes (a spoken answer's first
audio) is kept as the idle TTFA. Before those runs, the workload's first
requests run alone, one after another: the items each one makes of each node (``CostTable.requests``; a spoken answer runs the talker's
loop for as many frames as it speaks, a text answer does not run it). Each run
also gives the rank's loop time outside its steps (the worker's active seconds
less its steps' busy seconds, per step), the CPU seconds the conductor's
process and this one (the client) spent per request (``/proc``; zero where
there is none), and the cores the worker wanted while active (its
process's seconds running or ready to run, every thread, over its active
seconds: a one-thread worker's receiving and sending threads count, a
two-thread one's idle OpenMP thread does not, and another process's load
on the host does not lower it). The cores this process may run on (its CPU
affinity) are recorded with the costs. On a CPU host with a core for each node group, a last run puts
every group on a rank of its own (the stage run) at the workload's
concurrency: the seconds a message between ranks costs its sender. Node
counters are keyed by node for stateless engines and by component for KV
engines (the runtime's own keys); the planner maps both onto the placement.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from walkserve.core.outputs import OutputEvent, RequestFinished
from walkserve.core.proc import usable_cores
from walkserve.models.base import Model
from walkserve.planner.costs import CostTable, NodeCost, RequestItems
from walkserve.planner.workload import Workload

Progress = Callable[[str], None]
REQUESTS_ALONE = 16  # the workload's first requests, each run alone to count the items it makes (the simulation's
# default run: 4 x its concurrency of 4)


def one_rank_placement(model: Model, device: str) -> dict:
    """Every node of the model on one rank of ``device``."""
    return {"ranks": [{"id": 0, "device": device}], "nodes": [{"nodes": model.graph().node_names(), "ranks": [0]}]}


def default_threads() -> tuple[int, ...]:
    """The thread counts a CPU rank can get here: all the cores, and the share of each of two to four ranks."""
    cores = usable_cores()
    return tuple(sorted({max(1, cores // n) for n in (1, 2, 3, 4)}, reverse=True))


def profile(model: Model, workload: Workload, key: str, device: str = "cpu", dtype: str | None = None,
            threads: Sequence[int] | None = None, concurrencies: Sequence[int] | None = None, repeats: int = 2,
            progress: Progress | None = None) -> CostTable:
    """Measure ``model``'s node costs on one rank of ``device`` under ``workload``; returns the cost table."""
    table = CostTable(key, workload=workload.name, cores=usable_cores())
    counts = threads or (default_threads() if device == "cpu" else (1,))
    levels = concurrencies or tuple(sorted({1, max(1, workload.concurrency // 2), workload.concurrency,
                                            2 * workload.concurrency}))
    frontend: list[tuple[float, int]] = []  # (CPU seconds, requests) per run
    for t in counts:
        asyncio.run(_profile_threads(model, workload, table, device, dtype, t, levels, repeats, progress, frontend))
    table.frontend_s = sum(s for s, _ in frontend) / max(1, sum(n for _, n in frontend))
    groups = _stage_groups(model)
    cores = table.cores
    if device == "cpu" and 2 <= len(groups) <= cores:
        asyncio.run(_profile_stages(model, workload, table, groups, dtype, cores // len(groups), repeats, progress))
    return table


def _stage_groups(model: Model) -> list[tuple[str, ...]]:
    from walkserve.planner.search import node_groups

    return node_groups(model)


def stage_placement(groups: Sequence[Sequence[str]], device: str) -> dict:
    """Every node group on a rank of its own."""
    return {"ranks": [{"id": i, "device": device} for i in range(len(groups))],
            "nodes": [{"nodes": list(g), "ranks": [i]} for i, g in enumerate(groups)]}


async def _profile_stages(model: Model, workload: Workload, table: CostTable, groups: list[tuple[str, ...]],
                          dtype: str | None, threads: int, repeats: int, progress: Progress | None) -> None:
    """``hop_s``: the seconds the ranks spent sending each message to another rank (packing, encoding, sending)."""
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.engine import AsyncEngine

    if progress:
        progress(f"profile: every node group on a rank of its own ({len(groups)} ranks, {threads} thread(s) each)")
    config = RuntimeConfig(worker_threads=threads, status_interval_s=0.05, dtype=dtype)
    engine = await AsyncEngine.start(model, placement=stage_placement(groups, "cpu"), config=config)
    sent = [0.0, 0.0]  # messages, seconds
    try:
        await _run(engine, workload.specs(engine.processor, 1))
        for _ in range(repeats):
            before = await _counters(engine)
            await _run(engine, workload.specs(engine.processor, workload.concurrency))
            after = await _counters(engine)
            sent = [sent[i] + after.sent[i] - before.sent[i] for i in (0, 1)]
    finally:
        await engine.shutdown(drain_s=0)
    if sent[0] > 0:
        table.hop_s = sent[1] / sent[0]


async def _profile_threads(model: Model, workload: Workload, table: CostTable, device: str, dtype: str | None,
                           threads: int, levels: Sequence[int], repeats: int, progress: Progress | None,
                           frontend: list[tuple[float, int]]) -> None:
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.engine import AsyncEngine

    config = RuntimeConfig(worker_threads=threads, status_interval_s=0.05, dtype=dtype)
    if progress:
        progress(f"profile: starting {model.ref.family} on one {device} rank, {threads} thread(s)")
    engine = await AsyncEngine.start(model, placement=one_rank_placement(model, device), config=config)
    items: dict[str, list[float]] = {}
    worker = [0.0, 0.0]  # the worker's CPU seconds, its active seconds
    try:
        await _run(engine, workload.specs(engine.processor, 1))  # warm-up: first-call costs stay out of the samples
        if not table.requests:
            await _profile_requests(engine, workload, table, progress)
        for r, level in itertools.product(range(repeats), levels):  # round-robin: a burst of other work on the
            # host slows one repeat of a level, not all of them (the fit keeps the fastest, ``NodeCost.fastest``)
            if progress:
                progress(f"profile: {threads} thread(s), {level} request(s) at once, run {r + 1}/{repeats}")
            before = await _counters(engine)
            cpu = _frontend_cpu(engine)
            first = await _run(engine, workload.specs(engine.processor, level))
            frontend.append((max(0.0, _frontend_cpu(engine) - cpu), level))
            after = await _counters(engine)
            if level == 1:
                table.first_output_s[threads] = min(first, table.first_output_s.get(threads, first))
            _add_samples(table, threads, level, before.nodes, after.nodes, items)
            _add_outside(table, threads, level, before, after)
            worker = [worker[0] + after.cpu_s - before.cpu_s, worker[1] + after.active_s - before.active_s]
    finally:
        await engine.shutdown(drain_s=0)
    if device == "cpu" and worker[0] > 0 and worker[1] > 0:
        table.worker_cpu[threads] = worker[0] / worker[1]
    for name, per in items.items():
        table.items_per_request[name] = sum(per) / len(per)


async def _profile_requests(engine: Any, workload: Workload, table: CostTable, progress: Progress | None) -> None:
    """The items each of the workload's first requests makes of each node, run alone (a spoken answer and a text
    answer make different nodes' items, a spoken one as many frames as it speaks: the mix's mean is no request)."""
    if progress:
        progress(f"profile: the workload's first {REQUESTS_ALONE} requests, one at a time")
    kinds = workload.mix(REQUESTS_ALONE)
    before = await _counters(engine)
    for kind, spec in zip(kinds, workload.specs(engine.processor, REQUESTS_ALONE), strict=True):
        await _run(engine, [spec])
        after = await _counters(engine)
        items = {name: s.get("items", 0.0) - before.nodes.get(name, {}).get("items", 0.0) for name, s in after.nodes.items()}
        table.requests.append(RequestItems(kind.name, {n: v for n, v in items.items() if v > 0}))
        before = after


def _add_samples(table: CostTable, threads: int, requests: int, before: dict, after: dict,
                 items: dict[str, list[float]]) -> None:
    for name, s in after.items():
        b = before.get(name, {})
        steps = s.get("batches", 0.0) - b.get("batches", 0.0)
        n = s.get("items", 0.0) - b.get("items", 0.0)
        busy = s.get("busy_s", 0.0) - b.get("busy_s", 0.0)
        if steps <= 0:
            continue
        table.nodes.setdefault(name, NodeCost()).add(threads, requests, n / steps, busy / steps)
        items.setdefault(name, []).append(n / requests)


@dataclass
class _Counters:
    """The runtime's counters around one run: per node, rank 0's loop time, messages between ranks."""

    nodes: dict[str, dict[str, float]]
    active_s: float  # rank 0's loop seconds not waiting for a message (its steps included)
    sent: tuple[float, float]  # messages every rank sent to another, and the seconds sending them took
    cpu_s: float = 0.0  # rank 0's worker process's seconds running or ready to run, every thread (0: no /proc)


async def _counters(engine: Any) -> _Counters:
    await asyncio.sleep(0.1)  # the workers' last counters reach the conductor
    await engine.refresh_status()
    workers = engine.status.stats.workers
    peers = [to for w in workers.values() for to in w.sent_to.values()]
    pid = engine.status.stats.pids.get(0)
    return _Counters({k: dict(v) for k, v in engine.stats().nodes.items()},
                     workers[0].active_s if 0 in workers else 0.0,
                     (sum(p.get("messages", 0.0) for p in peers), sum(p.get("seconds", 0.0) for p in peers)),
                     _cpu_seconds(pid, waiting=True) if pid else 0.0)


def _frontend_cpu(engine: Any) -> float:
    """CPU seconds of this process (the client, the engine's frontend) and of the conductor's process."""
    conductor = getattr(engine.process, "pid", None)
    return time.process_time() + (_cpu_seconds(conductor) if conductor else 0.0)


def _cpu_seconds(pid: int, waiting: bool = False) -> float:
    """CPU seconds every thread of process ``pid`` has run (``/proc/PID/task/*/schedstat``; 0 without /proc);
    ``waiting``: and the seconds they were ready to run but waited for a core (what they wanted of the cores)."""
    total = 0.0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ran, wait = f.read().split()[:2]
                total += (int(ran) + (int(wait) if waiting else 0)) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    return total


def _add_outside(table: CostTable, threads: int, requests: int, before: _Counters, after: _Counters) -> None:
    """The rank's loop seconds outside its steps, per step (against the steps' mean members, like a node)."""
    steps = items = busy = 0.0
    for name, s in after.nodes.items():
        b = before.nodes.get(name, {})
        steps += s.get("batches", 0.0) - b.get("batches", 0.0)
        items += s.get("items", 0.0) - b.get("items", 0.0)
        busy += s.get("busy_s", 0.0) - b.get("busy_s", 0.0)
    if steps > 0 and after.active_s > before.active_s:
        table.loop.add(threads, requests, items / steps, max(0.0, after.active_s - before.active_s - busy) / steps)


async def _run(engine: Any, specs: list) -> float:
    """Run the requests at once; the seconds until the first of them has begun every output stream it makes
    (a spoken answer: its first audio, not its first text token)."""
    t0 = time.perf_counter()
    begun: list[float] = []

    async def one(spec: Any) -> None:
        firsts: dict[str, float] = {}  # modality -> its first output
        async for out in engine.generate(spec):
            if isinstance(out, OutputEvent):
                firsts.setdefault(out.modality, time.perf_counter() - t0)
            if isinstance(out, RequestFinished) and out.error:
                raise RuntimeError(f"profiling request failed: {out.error}")
        if firsts:
            begun.append(max(firsts.values()))

    await asyncio.gather(*(one(s) for s in specs))
    return min(begun) if begun else time.perf_counter() - t0
