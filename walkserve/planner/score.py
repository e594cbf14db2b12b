"""Score a placement from measured node costs: each rank's busy seconds per request, the bottleneck, TTFA.

The cost model (docs/placement.md, "How the planner scores"):

- every profiled unit (a stateless node, or a KV component with all its
  nodes: the runtime's own counter keys) makes ``items_per_request`` items
  per request; on a rank with ``t`` threads it runs them in steps of the batch
  the profile saw at the concurrency that replica carries (the workload's
  concurrency divided over its replicas), each step costing
  ``NodeCost.step_seconds(batch, t)`` and the rank's loop time outside it
  (``CostTable.loop_seconds``);
- a CPU rank's threads are the runtime's ``worker_threads`` where it sets
  them, else the host's cores divided over the placement's ranks (what the
  worker does with ``worker_threads = 0``); a GPU rank keeps the profiled
  cost. A host's cores: the count the devices give for it, else the count
  the profile recorded (the profiling host's CPU affinity), else this
  process's;
- each cross-rank edge costs ``hop_s`` per message to its sender and to its
  receiver, one message per producer step;
- a rank's busy seconds per request are the sum of the above over what it
  hosts; the busiest rank bounds the throughput: requests/s = 1 / its busy
  seconds (ranks work in parallel, streamed edges overlap them);
- the CPU ranks of one host share its cores: each wants the cores its
  worker wanted while active in the profile (``CostTable.demand``:
  measured, else its threads) while it works, so requests/s is also at most cores / the sum
  over those ranks of busy seconds x that demand (three one-thread ranks on
  two cores do not run three times as fast as one); the frontend's CPU per
  request (``frontend_s``: the conductor and the client) counts on the local
  host;
- a request's steps run one after another where they depend on each other:
  its latency is at least the sum of its steps on its busiest rank (steps on
  one rank run one after another; ranks overlap through streams) plus
  ``hop_latency_s`` per cross-rank message, and with the workload's
  concurrency C in flight requests/s is at most C / that latency (Little's
  law: a nested loop whose every inner step crosses ranks is latency-bound,
  however idle the ranks are);
- TTFA: the profiled time until a lone request has begun each of its outputs, at the
  threads of the slowest rank the request crosses, plus one hop per cross-rank
  edge; the idle figure, not the loaded one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from walkserve.core import env
from walkserve.core.proc import usable_cores
from walkserve.graph.routes import ToCarry, ToNode, ToStream
from walkserve.graph.walk import WalkGraph
from walkserve.placement.plan import Placement
from walkserve.planner.costs import CostTable


@dataclass
class Score:
    """A placement's predicted figures."""

    throughput: float  # requests per second
    ttfa_s: float
    rank_busy: dict[int, float]  # rank -> busy seconds per request
    unit_busy: dict[int, dict[str, float]]  # rank -> unit -> busy seconds per request
    hops: int  # cross-rank edges
    memory: dict[int, int] = field(default_factory=dict)  # rank -> bytes
    host_bound: bool = False  # the host's cores, shared by its CPU ranks, bound the throughput before any one rank
    latency_bound: bool = False  # a request's own chain of steps and hops, not a busy rank, bounds it
    latency_s: float | None = None  # a request's median time from start to finish (simulated; None: not known)

    @property
    def bottleneck(self) -> int:
        return max(self.rank_busy, key=lambda r: (self.rank_busy[r], -r))

    def bottleneck_unit(self) -> str:
        per = self.unit_busy.get(self.bottleneck) or {"(messages)": 0.0}
        return max(per, key=lambda u: per[u])


Cores = int | Mapping[str | None, int] | None  # one count for every host, a count per host (None: the local one)


def host_cores(host: str | None, table: CostTable, cores: Cores = None) -> int:
    """The cores of ``host``: as ``cores`` gives them (per host, or one count for all), else as the profile recorded
    them (the profiling host's), else this process's."""
    given = cores.get(host) if isinstance(cores, Mapping) else cores
    return given or table.cores or usable_cores()


def rank_threads(placement: Placement, table: CostTable, cores: Cores = None,
                 worker_threads: int | None = None) -> dict[int, int]:
    """Torch threads each rank's worker gets, as the worker decides: ``worker_threads`` (the runtime's, from the
    environment when not given) where positive, else a CPU rank its host's cores divided over the ranks."""
    fixed = env.WALKSERVE_WORKER_THREADS.get() if worker_threads is None else worker_threads
    n = max(1, len(placement.ranks))
    return {r: (fixed if fixed > 0 else max(1, host_cores(s.host, table, cores) // n)) if s.device == "cpu" else 1
            for r, s in placement.ranks.items()}


def unit_ranks(graph: WalkGraph, placement: Placement, unit: str) -> list[tuple[int, ...]]:
    """The rank sets a profiled unit (a node name, or a component's name) runs on, one per distinct placement."""
    out: list[tuple[int, ...]] = []
    for w, plan in graph.plans.items():
        for n, node in plan.nodes.items():
            if n == unit or (node.component == unit and unit not in plan.nodes):
                ranks = placement.ranks_for(w, n)
                if ranks not in out:
                    out.append(ranks)
    return out


def score(table: CostTable, graph: WalkGraph, placement: Placement, concurrency: int, cores: Cores = None,
          worker_threads: int | None = None) -> Score:
    """The placement's predicted throughput, TTFA and busiest rank under ``table``'s costs."""
    threads = rank_threads(placement, table, cores, worker_threads)
    unit_busy: dict[int, dict[str, float]] = defaultdict(dict)
    unit_steps: dict[str, float] = {}
    path: dict[int, float] = defaultdict(float)  # rank -> seconds of one request's steps there
    for unit, cost in table.nodes.items():
        sets = unit_ranks(graph, placement, unit)
        items = table.items_per_request.get(unit, 0.0)
        if not sets or not items:
            continue
        for ranks in sets:
            share = 1.0 / (len(sets) * len(ranks))  # the items this replica runs, of every request's
            for r in ranks:
                batch = cost.batch_at(max(1.0, concurrency * len(sets) * share), threads[r])
                step = cost.step_seconds(batch, threads[r]) + table.loop_seconds(batch, threads[r])
                busy = items * share * step / batch
                unit_busy[r][unit] = unit_busy[r].get(unit, 0.0) + busy
                unit_steps[unit] = unit_steps.get(unit, 0.0) + items * share / batch
                path[r] += items / len(sets) * step  # a request stays on a replica
    hops = _cross_edges(graph, placement, set(table.nodes))
    busy = {r: sum(unit_busy[r].values()) for r in placement.ranks}
    for (src, dst), producer in hops.items():
        per_request = unit_steps.get(producer, 1.0) * table.hop_s
        for r in (src, dst):
            busy[r] += per_request
            unit_busy[r]["(messages)"] = unit_busy[r].get("(messages)", 0.0) + per_request
    latency = max(path.values(), default=0.0)  # ranks overlap (streams); steps on one rank do not
    for producer in set(hops.values()):  # each item the producer makes crosses to another rank once
        latency += table.items_per_request.get(producer, 1.0) * table.hop_latency_s
    worst = max(busy.values()) if busy else 0.0
    used = [r for r in placement.ranks if busy[r] > 0] or list(placement.ranks)
    slowest = min(threads[r] for r in used)
    ttfa = _first_output(table, slowest) + table.hop_s * len(hops)
    rate = 1.0 / worst if worst > 0 else float("inf")
    host = _host_rate(placement, busy, threads, table, cores)
    little = concurrency / latency if latency > 0 else float("inf")
    return Score(min(rate, host, little), ttfa, busy, dict(unit_busy), len(hops), host_bound=host < rate,
                 latency_bound=little < min(rate, host))


def _host_rate(placement: Placement, busy: dict[int, float], threads: dict[int, int], table: CostTable,
               cores: Cores = None) -> float:
    """Requests/s the cores of the most constrained host allow its CPU ranks and, on the local host, the frontend
    (core-seconds per request against the host's cores)."""
    per_host: dict[str | None, float] = defaultdict(float)
    per_host[None] += table.frontend_s
    for r, spec in placement.ranks.items():
        if spec.device == "cpu":
            per_host[spec.host] += busy[r] * table.demand(threads[r])
    rates = [host_cores(h, table, cores) / load for h, load in per_host.items() if load > 0]
    return min(rates, default=float("inf"))


def _first_output(table: CostTable, threads: int) -> float:
    if not table.first_output_s:
        return 0.0
    measured = min(table.first_output_s, key=lambda t: (abs(t - threads), -t))
    return table.first_output_s[measured] * measured / max(1, threads)


def _cross_edges(graph: WalkGraph, placement: Placement, units: set[str]) -> dict[tuple[int, int], str]:
    """(producer rank, consumer rank) -> the producer's profiled unit, for edges whose ends sit on different ranks."""
    out: dict[tuple[int, int], str] = {}
    for w, plan in graph.plans.items():
        for (src, _), routes in plan.routes.items():
            if src not in plan.nodes:  # the walk's inputs: they come from the conductor
                continue
            for route in routes:
                if isinstance(route, (ToNode, ToCarry)):
                    dst = route.node
                elif isinstance(route, ToStream):
                    dst = plan.streams[route.stream].consumer
                else:
                    continue
                if dst not in plan.nodes:
                    continue
                a, b = placement.ranks_for(w, src), placement.ranks_for(w, dst)
                if set(a) != set(b):  # the same replicas: a request's two ends share one (placement.choice)
                    unit = src if src in units else plan.nodes[src].component
                    for ra in a:
                        for rb in b:
                            if ra != rb:
                                out.setdefault((ra, rb), unit)
    return out

