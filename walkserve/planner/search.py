"""Enumerate the placements of a model on a device list that fit memory, and score each.

Nodes move in groups: the nodes of one component (its per-request state and
weights stay together), with the components of one KV share group merged. A
candidate splits the groups into blocks, one block per rank (co-location
and stage splits: every set partition of the groups into at most as many
blocks as there are devices), and then gives the busiest block's rank
replicas on the devices left over, one more at a time (replicas of the
bottleneck stage). Blocks go to devices largest memory demand first onto the
largest device. Each candidate passes the same checks ``walkserve serve``
runs at start-up (coverage, state kept together, memory: the generic check
and the family's own memory report) or is dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from walkserve.core.errors import PlacementError
from walkserve.graph.walk import WalkGraph
from walkserve.models.base import Model
from walkserve.placement.plan import Placement, parse_placement
from walkserve.placement.resolve import check_placement, rank_demands, walk_nodes
from walkserve.planner.costs import CostTable
from walkserve.planner.devices import Device, host_cores
from walkserve.planner.parallel import in_processes
from walkserve.planner.score import Cores, Score, score
from walkserve.planner.simulate import Load, simulate

log = logging.getLogger(__name__)

MAX_CANDIDATES = 20000
PARALLEL_AFTER_S = 20.0  # a search's time left past which ``jobs`` processes score the rest (each loads the model)
PROGRESS_S = 10.0  # seconds between progress lines of a long search


@dataclass
class Candidate:
    name: str
    data: dict  # the placement file's mapping
    placement: Placement
    score: Score | None  # None: only the memory fit was asked


def node_groups(model: Model) -> list[tuple[str, ...]]:
    """Nodes that move together: one component's nodes, a KV share group's components' nodes."""
    graph, comps = model.graph(), model.components()
    key_of: dict[str, str] = {}
    for plan in graph.plans.values():
        for n, node in plan.nodes.items():
            spec = comps.get(node.component)
            key_of[n] = f"share:{spec.kv_share}" if spec is not None and spec.kv_share else node.component
    groups: dict[str, list[str]] = {}
    for n in graph.node_names():
        groups.setdefault(key_of.get(n, n), []).append(n)
    return [tuple(v) for v in groups.values()]


def partitions(n: int, max_blocks: int) -> Iterator[list[int]]:
    """Every split of ``n`` items into at most ``max_blocks`` blocks, as each item's block (first seen first)."""
    if n == 0:
        yield []
        return

    def grow(prefix: list[int], used: int) -> Iterator[list[int]]:
        if len(prefix) == n:
            yield list(prefix)
            return
        for b in range(min(used + 1, max_blocks)):
            prefix.append(b)
            yield from grow(prefix, max(used, b + 1))
            prefix.pop()

    yield from grow([], 0)


def placement_data(blocks: list[list[str]], replicas: list[list[int]], devices: list[Device]) -> dict:
    """The placement mapping: block i's nodes on ranks ``replicas[i]`` (indices into ``devices``)."""
    used = sorted({r for rs in replicas for r in rs})
    return {"ranks": [devices[r].rank_entry(r) for r in used],
            "nodes": [{"nodes": list(b), "ranks": list(rs)} for b, rs in zip(blocks, replicas, strict=True)]}


def describe(blocks: list[list[str]], replicas: list[list[int]], groups: list[tuple[str, ...]]) -> str:
    """``[lm] | [codec]``, ``[a, b] x2``: each rank's groups (named by their first node), replicas counted, in the
    order of their ranks (the block on rank 0 first), as the memory per rank is listed."""
    first = {g[0]: g for g in groups}
    parts = []
    for b, rs in sorted(zip(blocks, replicas, strict=True), key=lambda pair: min(pair[1])):
        names = [n for n in b if n in first]
        parts.append(f"[{', '.join(names)}]" + (f" x{len(rs)}" if len(rs) > 1 else ""))
    return " | ".join(parts)


class Checker:
    """The start-up checks of ``walkserve serve``, with each device's memory budget standing for its free memory."""

    def __init__(self, model: Model, devices: list[Device]):
        self.model, self.devices = model, devices
        self.budget = {d.device: d.memory for d in devices}
        self._built: dict[str, tuple[WalkGraph, dict]] = {}  # a model variant's graph and components, built once

    def _model(self, data: dict) -> Model:
        return self.model.for_placement(data)

    def _build(self, model: Model) -> tuple[WalkGraph, dict]:
        key = repr((model.ref.family, model.ref.path, sorted(model.ref.options.items())))
        if key not in self._built:
            self._built[key] = (model.graph(), model.components())
        return self._built[key]

    def graph(self, model: Model) -> WalkGraph:
        return self._build(model)[0]

    def components(self, model: Model) -> dict:
        return self._build(model)[1]

    def check(self, data: dict, source: str = "<planned>") -> Placement:
        model = self._model(data)
        comps = self.components(model)
        parsed = parse_placement(data, source)
        check_placement(parsed, self.graph(model), {c for c, s in comps.items() if s.stateful},
                        {c: s.weight_bytes for c, s in comps.items()}, {c: s.state_bytes for c, s in comps.items()},
                        device_free=self.budget.get, kv_shares={c: s.kv_share for c, s in comps.items() if s.kv_share},
                        movable={c for c, s in comps.items() if s.stateful and s.engine == "kv"})
        model.memory_report(parsed, self.budget.get)
        return parsed

    def memory(self, parsed: Placement) -> dict[int, int]:
        """Bytes each rank will hold (weights and state), as the generic check counts them."""
        model = self.model
        comps, graph = model.components(), model.graph()
        walks = walk_nodes(graph)
        return {r: sum(b for _, b in rank_demands(parsed, r, graph, walks, {c: s.weight_bytes for c, s in comps.items()},
                                                   {c: s.state_bytes for c, s in comps.items()}, self.budget.get))
                for r in parsed.ranks}


def _order_by_demand(blocks: list[list[str]], devices: list[Device], demand: Callable[[list[str]], int]) -> list[int]:
    """Device index for each block: the largest demand onto the largest device."""
    by_block = sorted(range(len(blocks)), key=lambda i: -demand(blocks[i]))
    by_device = sorted(range(len(devices)), key=lambda i: (-(devices[i].memory or 0), i))
    out = [0] * len(blocks)
    for b, d in zip(by_block, by_device, strict=False):
        out[b] = d
    return out


def score_placement(model: Model, table: CostTable, parsed: Placement, load: int | Load, scorer: str = "simulate",
                    checker: Checker | None = None, cores: Cores = None) -> Score:
    """``parsed``'s predicted figures: simulated (``simulate``), or the analytical bound (``score``); ``cores``:
    the hosts' CPU cores where the devices give them (``score.host_cores``)."""
    load = Load.of(load)
    graph = checker.graph(model) if checker else model.graph()
    if scorer == "bound":
        return score(table, graph, parsed, load.concurrency, cores)
    return simulate(table, graph, parsed, load, checker.components(model) if checker else model.components(), cores)


def enumerate_candidates(model: Model, devices: list[Device], table: CostTable | None, load: int | Load,
                         rejected: list[str] | None = None, limit: int = MAX_CANDIDATES,
                         scorer: str = "simulate", progress: Callable[[str], None] | None = None,
                         jobs: int = 1) -> list[Candidate]:
    """Every placement that fits (up to ``limit``), scored with ``table`` (unscored without one), best first;
    ``progress`` hears how far the search is every ``PROGRESS_S`` seconds. ``jobs`` > 1: a scored search that would
    take more than ``PARALLEL_AFTER_S`` more goes on in that many processes (the same candidates, in the same order)."""
    search = ChainSearch(model, devices, table, load, scorer)
    chains = list(partitions(len(search.busy), len(devices)))
    out: list[Candidate] = []
    seen: set[str] = set()
    report = _Reporter(progress, len(devices))
    for cands, why_not in _chains(search, model, chains, jobs):
        if rejected is not None:
            rejected.extend(why_not)
        for cand in cands:
            if cand.name not in seen:
                seen.add(cand.name)
                out.append(cand)
                report(out)
        if len(out) >= limit:
            del out[limit:]
            break
    out.sort(key=lambda c: (-c.score.throughput if c.score else 0.0, c.score.ttfa_s if c.score else 0.0, c.name))
    return out


def _chains(search: ChainSearch, model: Model, chains: list[list[int]], jobs: int) -> Iterator[tuple[list, list[str]]]:
    """Each chain's (candidates, rejections) in order: scored here, and once the chains scored so far say the rest
    would take over ``PARALLEL_AFTER_S``, by ``jobs`` processes (when those fail, by this one again, from the
    first chain they did not give back)."""
    t0, done = time.monotonic(), 0
    while done < len(chains):
        yield search.chain(chains[done])
        done += 1
        left = len(chains) - done
        if jobs > 1 and left > 1 and search.table is not None and (time.monotonic() - t0) / done * left > PARALLEL_AFTER_S:
            try:
                for result in in_processes(model, search.devices, search.table, search.load, search.scorer,
                                           chains[done:], jobs):
                    yield result
                    done += 1
            except Exception as e:  # a process that could not start, load the model or answer: go on here
                log.warning("plan: scoring in %d processes failed (%s: %s); the %d split(s) left are scored here",
                            jobs, type(e).__name__, e, len(chains) - done)
            jobs = 1


class ChainSearch:
    """What a search scores its splits with (the model's node groups, its start-up checker, the costs and the load).
    A chain is one split of the node groups into blocks: the blocks on ranks of their own, then the busiest block's
    rank given a replica on a spare device, one more at a time, while devices are left (``chain``)."""

    def __init__(self, model: Model, devices: list[Device], table: CostTable | None, load: int | Load, scorer: str):
        self.devices, self.table, self.load, self.scorer = devices, table, load, scorer
        self.groups = node_groups(model)
        self.checker = Checker(model, devices)
        self.comps, graph = model.components(), model.graph()
        self.comp_of = {n: plan.nodes[n].component for plan in graph.plans.values() for n in plan.nodes}
        self.busy, self.idle = _split_idle(self.groups, self.comp_of, table)

    def demand(self, block: list[str]) -> int:
        comps = self.comps
        return sum(comps[c].weight_bytes for c in {self.comp_of[n] for n in block} if c in comps)

    def chain(self, assign: list[int]) -> tuple[list[Candidate], list[str]]:
        """The candidates of the split ``assign`` (each busy group's block) in the order they come, and why the
        placements that did not fit were dropped. Without a cost table, the first that fits ends the chain."""
        busy, devices = self.busy, self.devices
        blocks = [[n for g, b in zip(busy, assign, strict=True) if b == k for n in g] for k in range(max(assign) + 1)]
        if self.idle:  # nodes the workload never runs go along with the lightest block
            lightest = min(range(len(blocks)), key=lambda k: self.demand(blocks[k]))
            blocks[lightest] += [n for g in self.idle for n in g]
        replicas = [[h] for h in _order_by_demand(blocks, devices, self.demand)]
        out: list[Candidate] = []
        rejected: list[str] = []
        while True:
            cand = _candidate(self.checker, blocks, replicas, devices, self.groups, self.table, self.load, rejected,
                              self.scorer)
            if cand is not None:
                out.append(cand)
            spare = [i for i in range(len(devices)) if all(i not in rs for rs in replicas)]
            if cand is None or cand.score is None or not spare:
                return out, rejected
            hot = _block_of_rank(replicas, cand.score.bottleneck)
            replicas = [rs + [spare[0]] if i == hot else rs for i, rs in enumerate(replicas)]


class _Reporter:
    """Says every ``PROGRESS_S`` seconds how many placements are scored and the best so far (a search over eight
    GPUs scores hundreds, each a simulated run of the workload)."""

    def __init__(self, progress: Callable[[str], None] | None, devices: int):
        self.progress, self.devices = progress, devices
        self.start = self.last = time.monotonic()

    def __call__(self, scored: list[Candidate]) -> None:
        now = time.monotonic()
        if self.progress is None or now - self.last < PROGRESS_S:
            return
        self.last = now
        best = max((c for c in scored if c.score), key=lambda c: c.score.throughput, default=None)
        lead = f"; best so far {best.name} at {best.score.throughput:.3g} req/s" if best else ""
        n = len(scored)
        self.progress(f"plan: {n} placement{'s' if n != 1 else ''} on {self.devices} devices scored in "
                      f"{now - self.start:.0f} s{lead}")


def _split_idle(groups: list[tuple[str, ...]], comp_of: dict[str, str],
                table: CostTable | None) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """(groups the workload runs, groups it never runs): only the first are spread over the devices."""
    if table is None:
        return groups, []
    ran = {u for u, n in table.items_per_request.items() if n > 0}
    busy = [g for g in groups if any(n in ran or comp_of.get(n) in ran for n in g)]
    if not busy:
        return groups, []
    return busy, [g for g in groups if g not in busy]


def _block_of_rank(replicas: list[list[int]], rank: int) -> int:
    return next(i for i, rs in enumerate(replicas) if rank in rs)


def _candidate(checker: Checker, blocks: list[list[str]], replicas: list[list[int]], devices: list[Device],
               groups: list[tuple[str, ...]], table: CostTable | None, load: int | Load,
               rejected: list[str] | None, scorer: str) -> Candidate | None:
    data = placement_data(blocks, replicas, devices)
    name = describe(blocks, replicas, groups)
    try:
        parsed = checker.check(data, f"<candidate {name}>")
    except PlacementError as e:
        if rejected is not None:
            rejected.append(f"{name}: {e}")
        return None
    sc = (score_placement(checker.model.for_placement(data), table, parsed, load, scorer, checker,
                          host_cores(devices)) if table is not None else None)
    if sc is not None:
        sc.memory = checker.memory(parsed)
    return Candidate(name, data, parsed, sc)


def smallest_fit(model: Model, devices: list[Device], extra: int = 8) -> str | None:
    """The fewest devices like the largest given one that hold the model, described, or None if none up to +extra."""
    largest = max(devices, key=lambda d: d.memory or 0)
    for n in range(1, len(devices) + extra + 1):
        trial = [Device(largest.device if largest.kind == "cpu" else f"cuda:{i}", largest.memory, largest.host,
                        largest.cores)
                 for i in range(n)]
        if enumerate_candidates(model, trial, None, 1, limit=1):
            mem = f" of {largest.memory / 2**30:.3g} GiB" if largest.memory else ""
            return f"{n} x {largest.kind}{mem}"
    return None
