"""``./dev bench runtime --hosts 2``: what running ranks on two Ray nodes costs, against one host, in one run.

A two-node Ray cluster on this machine (head 127.0.0.2, node 127.0.0.3:
loopback aliases; inside a private network namespace when root, so nothing
leaves the machine) serves the Null-engine loop ``a -> b``:

1. loop overhead: a and b on two local workers (IPC, forked) vs on two Ray
   ranks on two nodes (TCP between the nodes); wall µs per loop step;
2. transfer rate: a sends b a ``--payload-mib`` float32 tensor every step;
   both Ray ranks on one node (shared memory) vs on two nodes (inline in the
   TCP frame); payload bytes per wall second, the loop's own cost included.

Both loopback nodes share the machine's cores and memory bandwidth, so the
inter-node figures are a lower bound for two real hosts on a fast link and
an upper bound for a slow one.
"""

from __future__ import annotations

import statistics
import time

from benchmarks.common import conditions, table
from walkserve.core.config import RuntimeConfig
from walkserve.core.request import RequestSpec
from walkserve.entrypoint.sync import Engine
from walkserve.testing.fixtures.base import FixtureParams

HEAD, NODE = "127.0.0.2", "127.0.0.3"


def _placement(ray_hosts: tuple[str | None, str | None] | None) -> dict:
    """a on rank 0, b on rank 1; ``ray_hosts`` None: two local workers; else each rank's Ray host."""
    nodes = [{"nodes": ["a"], "ranks": [0]}, {"nodes": ["b"], "ranks": [1]}]
    if ray_hosts is None:
        return {"ranks": [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu"}], "nodes": nodes}
    ranks = [{"id": r, "device": "cpu", **({"host": h} if h else {})} for r, h in enumerate(ray_hosts)]
    return {"launcher": "ray", "ranks": ranks, "nodes": nodes}


def _run(engine: Engine, batch: int, steps: int) -> float:
    """Wall seconds for ``batch`` requests of ``steps`` loop steps in lockstep."""
    requests = [RequestSpec({}, params=FixtureParams(steps=steps)) for _ in range(batch)]
    t0 = time.perf_counter()
    results = engine.run(requests, timeout=600)
    wall = time.perf_counter() - t0
    assert all(len(r.events) == steps for r in results), "a request lost outputs"
    return wall


def _engine(place: dict, address: str | None, threads: int, payload: int = 0) -> Engine:
    config = RuntimeConfig(max_running=256, worker_threads=threads, ray_address=address, start_timeout_s=600)
    return Engine.start("fixture-bench-null", placement=place, config=config, model_options={"payload_bytes": payload})


def loop_overhead(address: str, batches: tuple[int, ...], steps: int, threads: int, repeat: int) -> list[tuple]:
    rows = []
    medians: dict[tuple[str, int], float] = {}
    for label, hosts in (("2 local workers (IPC)", None), ("2 Ray nodes (TCP)", (None, NODE))):
        with _engine(_placement(hosts), address, threads) as engine:
            _run(engine, max(batches), steps)  # warm up
            for b in batches:
                runs = [_run(engine, b, steps) / steps * 1e6 for _ in range(repeat)]
                medians[(label, b)] = statistics.median(runs)
                rows.append((label, b, medians[(label, b)], min(runs), max(runs)))
    local, remote = "2 local workers (IPC)", "2 Ray nodes (TCP)"
    return [(*row, row[2] / medians[(local, row[1])] if row[0] == remote else 1.0) for row in rows]


def transfer_rate(address: str, payload: int, steps: int, threads: int, repeat: int) -> list[tuple]:
    rows, rates = [], {}
    for label, hosts in (("1 Ray node (shm)", (None, HEAD)), ("2 Ray nodes (inline TCP)", (None, NODE))):
        with _engine(_placement(hosts), address, threads, payload) as engine:
            _run(engine, 1, max(2, steps // 4))  # warm up
            runs = [payload * steps / _run(engine, 1, steps) for _ in range(repeat)]
            engine.stats()
            sent = engine.status.stats.workers[0]
        rates[label] = statistics.median(runs)
        via = "shm" if sent.shm_to else "inline"
        rows.append((label, via, rates[label] / 2**20, min(runs) / 2**20, max(runs) / 2**20))
    base = rates["1 Ray node (shm)"]
    return [(*row, row[2] * 2**20 / base) for row in rows]


def report(quick: bool, steps: int, threads: int, payload_mib: float) -> int:
    from walkserve.testing.ray_cluster import private_cluster

    steps = 30 if quick else steps
    batches = (1, 16) if quick else (1, 16, 64)
    repeat = 1 if quick else 3
    payload = int(payload_mib * 2**20) // 4 * 4
    t_steps = 8 if quick else 40
    with private_cluster((HEAD, 2), {NODE: 2}) as cluster:
        where = "a private network namespace" if cluster.netns else "this network namespace (not root)"
        loop = loop_overhead(cluster.address, batches, steps, threads, repeat)
        moved = transfer_rate(cluster.address, payload, t_steps, threads, repeat)
    note = "one measured run each" if quick else "median, min and max of 3 measured runs after a warm-up run"
    print(f"## Two Ray nodes against one host\n\nconditions: {conditions()}; Ray cluster on loopback aliases "
          f"{HEAD} + {NODE} in {where}, up in {cluster.start_s:.1f} s; worker threads {threads}; {note}\n")
    print(f"### Null-engine loop a -> b, {steps} steps\n")
    print(table(["placement", "batch", "µs per step", "min", "max", "vs local"], loop))
    print(f"\n### a -> b tensor of {payload / 2**20:.1f} MiB per step, batch 1, {t_steps} steps\n")
    print(table(["placement", "path (rank 0's counters)", "MiB/s", "min", "max", "vs shm"], moved))
    print("\nMiB/s = payload bytes / wall time of the whole loop (the loop's own cost per step included).")
    return 0
