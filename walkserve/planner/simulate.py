"""Score a placement by simulating it: ranks as servers, each request's items as a chain, a clock, the workload's load.

The big idea: replay the workload on the placement in virtual time, with the
profiled step costs as the only durations. Everything the analytical bound
(``score``) has to guess (how busy a rank is while it waits for another, how
large batches get, what a cross-rank hop does to a nested loop) falls out of
running it.

    request  (``flow``) items of each unit, one after another within a unit,
             each waiting for the items of the units that feed it; request r
             makes what the workload's request r made when the profile ran
             it alone (cycling over those it ran: a spoken answer its frames,
             a text answer its tokens, in the mix's order)
    rank     one server: runs one step at a time; when idle it takes the next
             unit with ready items, round-robin over its units (the worker
             passes over every cohort in turn), and steps up to that unit's
             batch bound (``cap``) of them, which costs the profiled
             ``NodeCost.step_seconds(batch, threads)`` plus the rank's loop
             time outside a step (``CostTable.loop_seconds``: receiving,
             scheduling, routing; the profile measures it per step)
    cohort   a loop of several units (``flow.Flow.heads``) is joined at an
             iteration boundary: a request starts an iteration on a rank only
             with the requests inside one there or when none is (the
             worker's cohort), so requests that reach it apart step together
    host     CPU ranks of one host share its cores (``score.host_cores``: the
             devices' count for it, else the profile's, else this process's):
             a running step wants the cores its worker wanted while active
             in the profile (``CostTable.demand``: measured per thread count,
             else its threads), and while the running steps want more cores
             than the host has, each runs slower in proportion (processor
             sharing: a step's remaining work drains at cores / wanted); a
             GPU rank runs alone
    frontend the conductor and the client: one more server of one thread on
             the local host, sharing its cores with the CPU ranks, that takes
             the profiled ``frontend_s`` per request in pieces as the
             request's client outputs reach it (``flow.FRONTEND``)
    hop      an item for a unit on another rank arrives ``hop_latency_s``
             later; each message (one per step per destination) costs its
             sender and its receiver ``hop_s`` of busy time
    replica  a request takes a replica of each unit as the conductor gives
             it (``placement.choice``): when the unit is first needed (its
             first input is sent to it, or it starts), the graph's walks up to
             the first that runs it place the request's units no earlier walk
             placed, walk after walk, each unit on a replica the request
             was given already when one is a candidate (it stays inside one
             replica of a replicated block: Orpheus's codec, first run by the
             decode walk, beside the LM its prefill walk placed), else on the
             least loaded replica by the requests placed on each rank; then
             each keeps it (per-request state stays put). The graph's order
             of walks stands for a request's. A unit placed differently per walk runs its first
             items (prefill) on the first placement and the rest on the last
    load     closed loop: ``concurrency`` clients, each sending its next
             request when the last one finishes; or open loop: Poisson
             arrivals at ``rate`` requests/s (seeded: the same every run)

Reported: requests/s over the run (requests / first start to last finish),
the median time until a request has begun each of its client outputs under that
load (TTFA: a spoken answer's first audio, not its first text token),
and each rank's busy seconds per request.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections import deque
from dataclasses import dataclass

from walkserve.engines.spec import ComponentSpec
from walkserve.graph.walk import WalkGraph
from walkserve.placement.plan import Placement
from walkserve.planner.costs import CostTable
from walkserve.planner.flow import FRONTEND, Flow, build_flow
from walkserve.planner.score import Cores, Score, _cross_edges, host_cores, rank_threads, unit_ranks

FRONTEND_RANK = -1  # the frontend's server: not a rank of the placement, left out of the reported busy seconds


@dataclass(frozen=True)
class Load:
    """The load a placement is scored under."""

    concurrency: int = 4  # closed loop: requests in flight
    rate: float | None = None  # open loop: requests/s arriving (then concurrency is ignored)
    requests: int | None = None  # requests to simulate; default max(16, 4 x concurrency)

    @property
    def count(self) -> int:
        return self.requests or max(16, 4 * self.concurrency)

    @classmethod
    def of(cls, load: int | Load) -> Load:
        return load if isinstance(load, Load) else cls(int(load))


@dataclass
class _Step:
    rank: int
    unit: int
    members: list[int]  # requests
    work: float  # seconds left at full speed
    start: float


class _Rank:
    def __init__(self, rank: int, threads: int, host: tuple, demand: float):
        self.id, self.threads, self.host = rank, threads, host  # host: (name, "cpu"), or (rank, device) for a GPU
        self.demand = demand  # cores it wants while stepping (a CPU rank)
        self.ready: dict[int, deque[int]] = {}  # unit -> requests with an item ready here
        self.waiting = 0  # items in ``ready``
        self.turn = 0  # round-robin position over ``ready``'s units
        self.step: _Step | None = None
        self.debt = 0.0  # message seconds the next step pays
        self.busy: dict[int, float] = {}  # unit -> seconds stepping it
        self.messages = 0.0
        self.active = 0  # requests with a unit placed here (the conductor's load, for the least loaded replica)


class Simulation:
    """One run of the workload on one placement; ``run()`` returns its Score."""

    def __init__(self, table: CostTable, flow: Flow, graph: WalkGraph, placement: Placement, load: Load,
                 cores: Cores = None, worker_threads: int | None = None):
        self.table, self.flow, self.load = table, flow, load
        threads = rank_threads(placement, table, cores, worker_threads)
        self.ranks = {r: _Rank(r, threads[r], (s.host, "cpu"), table.demand(threads[r])) if s.device == "cpu" else
                      _Rank(r, threads[r], (r, s.device), 1.0) for r, s in placement.ranks.items()}
        if FRONTEND in flow.index:
            self.ranks[FRONTEND_RANK] = _Rank(FRONTEND_RANK, 1, (None, "cpu"), 1.0)
        self.cores = {rk.host: host_cores(rk.host[0], table, cores) for rk in self.ranks.values() if rk.host[1] == "cpu"}
        self.sets = [[(FRONTEND_RANK,)] if u.name == FRONTEND else
                     unit_ranks(graph, placement, u.name) or [tuple(placement.ranks)[:1]] for u in flow.units]
        self.consumers: list[list[tuple[int, int]]] = [[] for _ in flow.units]  # unit -> (consumer, input index)
        for b, u in enumerate(flow.units):
            for i, e in enumerate(u.inputs):
                self.consumers[e.src].append((b, i))
        self.costs = [table.nodes.get(u.name) for u in flow.units]  # None: the frontend
        self.walks = [sorted({v for n, node in plan.nodes.items() if (v := flow.unit_of(n, node.component)) is not None})
                      for plan in graph.plans.values()]  # each walk's units, in the graph's order
        self.first_walk = [next((i for i, units in enumerate(self.walks) if u in units), None)
                           for u in range(len(flow.units))]  # unit -> the first walk that runs it (None: the frontend)
        self.profiled = self._profiled_items()
        self.held: dict[int, set[int]] = {h: set() for h in flow.heads}  # loop head -> requests waiting to join
        self.tails = {tail for tail, _ in flow.heads.values()}
        self.loops_of: dict[int, list[int]] = {}  # unit -> the loop heads whose head or tail it is
        for head, (tail, _) in flow.heads.items():
            for v in {head, tail}:
                self.loops_of.setdefault(v, []).append(head)
        self.inside_at: dict[int, dict[int, int]] = {h: {} for h in flow.heads}  # head -> rank -> requests inside
        self.memo: dict[tuple[int, int, int], float] = {}  # (unit, batch, threads) -> step seconds
        self.now = 0.0
        self.events: list[tuple[float, int, str, tuple]] = []
        self.seq = 0
        self.n: list[list[int]] = []  # request -> unit -> items
        self.done: list[list[int]] = []
        self.pending: list[list[bool]] = []
        self.got: list[list[list[int]]] = []  # request -> unit -> input -> source items arrived
        self.need: list[list[list[list[int]]]] = []  # request -> unit -> input -> item k -> source items it waits for
        self.needs_of: dict[tuple[int, ...], list[list[list[int]]]] = {}  # a request's items -> its ``need``
        self.homes: list[list[list[int] | None]] = []  # request -> unit -> rank per placement segment (None: not yet)
        self.placed: list[set[int]] = []  # request -> the ranks it has a unit on
        self.replicas: list[set[int]] = []  # request -> the ranks it was given among replicas (its later units go there)
        self.where: list[dict[int, int]] = []  # request -> loop head -> the rank it is inside an iteration on
        self.left: list[int] = []  # request -> items still to run
        self.started: list[float] = []
        self.first: list[dict[int, float]] = []  # request -> client unit -> when its first item completed
        self.finished: list[float] = []
        self.done_at: dict[int, float] = {}  # request -> when it finished
        self.oversubscribed = 0.0  # seconds some host's running steps wanted more cores than it has
        self.forced = 0  # items released without their inputs (a rounding deadlock in a cycle; should stay 0)

    # ---- requests --------------------------------------------------------------------------
    def _profiled_items(self) -> list[list[int]]:
        """Per request the profile ran alone, the items it made of each unit (the frontend: of its busiest client
        unit, one piece of the frontend's CPU per client output); empty where the profile did not run them."""
        out = []
        for req in self.table.requests:
            n = [round(req.items.get(u.name, 0.0)) for u in self.flow.units]
            clients = [n[i] for i, u in enumerate(self.flow.units) if u.client]
            out.append([max(clients, default=0) if u.name == FRONTEND else n[i] for i, u in enumerate(self.flow.units)])
        return out

    def _items(self, r: int) -> list[int]:
        """Request ``r``'s items of each unit: those the workload's request ``r`` made alone in the profile (a whole
        request's: its counts agree around a loop); without them (a profile cached before they were measured), the
        mix's mean, rounded per request."""
        if self.profiled:
            return list(self.profiled[r % len(self.profiled)])
        return [math.floor((r + 1) * u.items + 1e-9) - math.floor(r * u.items + 1e-9) for u in self.flow.units]

    def _needs(self, n: list[int]) -> list[list[list[int]]]:
        """For a request making ``n`` items of each unit: per unit and input, the source items its item ``k`` waits
        for (``Edge.needs``; index k, 1-based; 0 where the source makes none), worked out once per kind of request."""
        key = tuple(n)
        found = self.needs_of.get(key)
        if found is None:
            found = self.needs_of[key] = [
                [[0] + [e.needs(k, n[e.src], n[u]) for k in range(1, n[u] + 1)] if n[e.src] else [0] * (n[u] + 1)
                 for e in unit.inputs] for u, unit in enumerate(self.flow.units)]
        return found

    def start_request(self) -> None:
        r = len(self.n)
        n = self._items(r)
        self.n.append(n)
        self.done.append([0] * len(n))
        self.pending.append([False] * len(n))
        self.got.append([[0] * len(u.inputs) for u in self.flow.units])
        self.need.append(self._needs(n))
        self.homes.append([None] * len(n))
        self.placed.append(set())
        self.replicas.append(set())
        self.where.append({})
        self.left.append(sum(n))
        self.started.append(self.now)
        self.first.append({})
        for u in range(len(n)):
            self.check(r, u)
        if self.left[r] == 0:
            self.finish(r)

    def choose(self, r: int, u: int) -> None:
        """Unit ``u`` is first needed by request ``r``: the walks of the graph up to the first that runs it start,
        one after another, and each places the units of ``r``'s that no earlier walk placed, all on the least
        loaded replica by the same load (the conductor places a walk's nodes at once)."""
        first = self.first_walk[u]
        groups = [[u]] if first is None else self.walks[: first + 1]
        for units in groups:
            new = [v for v in units if self.homes[r][v] is None and (self.n[r][v] or v == u)]
            load = {k: rk.active for k, rk in self.ranks.items()}
            for v in new:
                self.homes[r][v] = [min([x for x in s if x in self.replicas[r]] or s, key=lambda x: (load[x], x))
                                    for s in self.sets[v]]
                self.replicas[r].update(h for h, s in zip(self.homes[r][v], self.sets[v], strict=True) if len(s) > 1)
                for h in set(self.homes[r][v]) - self.placed[r]:
                    self.placed[r].add(h)
                    self.ranks[h].active += 1

    def home(self, r: int, u: int, k: int) -> int:
        """The rank of item ``k`` (1-based) of unit ``u`` for request ``r``."""
        hs = self.homes[r][u]
        if hs is None:
            self.choose(r, u)
            hs = self.homes[r][u]
        return hs[k - 1] if k <= len(hs) else hs[-1]

    def check(self, r: int, u: int, force: bool = False) -> bool:
        """Queue unit ``u``'s next item of request ``r`` on its rank if its inputs are in."""
        n, done = self.n[r], self.done[r]
        if self.pending[r][u] or done[u] >= n[u]:
            return False
        k = done[u] + 1
        if not force:
            got = self.got[r][u]
            for i, need in enumerate(self.need[r][u]):
                if got[i] < need[k]:
                    return False
            if u in self.held:
                if self.joining_waits(r, u, k):
                    self.held[u].add(r)
                    return False
                self.held[u].discard(r)
        self.pending[r][u] = True
        rank = self.ranks[self.home(r, u, k)]
        q = rank.ready.get(u)
        if q is None:
            q = rank.ready[u] = deque()
        q.append(r)
        rank.waiting += 1
        if u in self.held:
            self.touch(r, u)  # a queued item is not inside an iteration (an item forced out may have been)
        return True

    # ---- a loop's cohort ---------------------------------------------------------------------
    def joining_waits(self, r: int, head: int, k: int) -> bool:
        """Whether request ``r``'s iteration ``k`` of the loop starting at ``head`` waits for the boundary: the
        worker's cohort lets a member start an iteration only with the others (or when none is inside one), so
        requests that reach a loop apart step its units together."""
        rank = self.home(r, head, k)
        return self.inside_at[head].get(rank, 0) > (self.where[r].get(head) == rank)

    def inside(self, r: int, head: int) -> int | None:
        """The rank where request ``r`` is inside an iteration of ``head``'s loop (started it, not at its end), or
        None."""
        n, done = self.n[r], self.done[r]
        tail, carry = self.flow.heads[head]
        d = done[head]
        if not n[head] or d == 0 or self.pending[r][head] or r in self.held[head] or done[tail] >= n[tail]:
            return None
        if d >= n[head] or self.got[r][head][carry] < self.need[r][head][carry][d + 1]:
            return self.home(r, head, d)
        return None

    def touch(self, r: int, u: int) -> None:
        """Request ``r``'s state of unit ``u`` changed: recount it inside the loops ``u`` starts or ends (``inside_at``
        is what a scan of every live request with ``inside`` would count, kept as it changes)."""
        for head in self.loops_of.get(u, ()):
            old, new = self.where[r].pop(head, None), self.inside(r, head)
            if old is not None:
                self.inside_at[head][old] -= 1
            if new is not None:
                self.where[r][head] = new
                self.inside_at[head][new] = self.inside_at[head].get(new, 0) + 1

    def release_held(self) -> None:
        """Requests waiting to join a loop look again (a member reached an iteration's end, or left)."""
        for head, waiting in self.held.items():
            for r in sorted(waiting):
                self.check(r, head)

    def finish(self, r: int) -> None:
        self.finished.append(self.now)
        self.done_at[r] = self.now
        for h in self.placed[r]:
            self.ranks[h].active -= 1
        if self.load.rate is None and len(self.n) < self.load.count:
            self.start_request()
        self.release_held()

    # ---- ranks -----------------------------------------------------------------------------
    def dispatch(self, rank: _Rank) -> None:
        if rank.step is not None or not rank.waiting:
            return
        units = sorted(u for u, q in rank.ready.items() if q)
        u = next((x for x in units if x >= rank.turn), units[0])
        rank.turn = u + 1
        q = rank.ready[u]
        members = [q.popleft() for _ in range(min(len(q), self.flow.units[u].cap))]
        rank.waiting -= len(members)
        work = self.step_seconds(u, members, rank.threads) + rank.debt
        rank.messages += rank.debt
        rank.debt = 0.0
        rank.step = _Step(rank.id, u, members, work, self.now)

    def step_seconds(self, u: int, members: list[int], threads: int) -> float:
        """A step of unit ``u`` for ``members``: the profiled step and the rank's loop time outside it."""
        cost = self.costs[u]
        if cost is None:  # the frontend: its CPU seconds per request, in equal pieces, one per client item
            return sum(self.table.frontend_s / self.n[r][u] for r in members)
        key = (u, len(members), threads)
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = cost.step_seconds(len(members), threads) + self.table.loop_seconds(len(members), threads)
        return found

    def complete(self, step: _Step) -> None:
        rank = self.ranks[step.rank]
        rank.step = None
        rank.busy[step.unit] = rank.busy.get(step.unit, 0.0) + self.now - step.start
        u, client, looped = step.unit, self.flow.units[step.unit].client, step.unit in self.loops_of
        sent: set[int] = set()
        for r in step.members:
            n, done = self.n[r], self.done[r]
            done[u] += 1
            self.pending[r][u] = False
            self.left[r] -= 1
            if looped:
                self.touch(r, u)
            if client:
                self.first[r].setdefault(u, self.now)
            for b, i in self.consumers[u]:
                if not n[b]:
                    continue
                to = self.home(r, b, done[b] + 1 if done[b] < n[b] else n[b])
                if to == step.rank or to == FRONTEND_RANK:  # the frontend's receiving is in its measured CPU
                    self.arrive(r, b, i)
                else:
                    sent.add(to)
                    self._at(self.now + self.table.hop_latency_s, "arrive", (r, b, i))
            self.check(r, u)
            if self.left[r] == 0:
                self.finish(r)
        if u in self.tails:
            self.release_held()
        for to in sent:  # one message per step per destination
            rank.debt += self.table.hop_s
            self.ranks[to].debt += self.table.hop_s

    def arrive(self, r: int, u: int, i: int) -> None:
        self.got[r][u][i] += 1
        looped = u in self.held
        if looped:
            self.touch(r, u)  # the carry's arrival ends ``r``'s iteration
        self.check(r, u)
        if looped:
            self.release_held()

    def _at(self, t: float, kind: str, payload: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    # ---- the clock -------------------------------------------------------------------------
    def speeds(self, running: list[_Step]) -> dict[int, float]:
        """Each running step's speed: 1, or its host's cores over the cores the running steps there want."""
        want: dict[tuple, float] = {}
        for s in running:
            rank = self.ranks[s.rank]
            want[rank.host] = want.get(rank.host, 0.0) + rank.demand
        out = {}
        for s in running:
            host = self.ranks[s.rank].host
            out[s.rank] = min(1.0, self.cores[host] / want[host]) if host in self.cores else 1.0
        return out

    def run(self) -> Score:
        if self.load.rate is None:
            for _ in range(min(self.load.concurrency, self.load.count)):
                self.start_request()
        else:
            rng, t = random.Random(0), 0.0
            for _ in range(self.load.count):
                self._at(t, "start", ())
                t += rng.expovariate(self.load.rate)
        while len(self.finished) < self.load.count:
            for rank in self.ranks.values():
                if rank.step is None and rank.waiting:
                    self.dispatch(rank)
            if not self.advance():
                break
        return self.score()

    def advance(self) -> bool:
        """Move the clock to the next step end or event and handle it; False when nothing can move."""
        running = [rk.step for rk in self.ranks.values() if rk.step is not None]
        if not running and not self.events:
            return self.unstick()
        speed = self.speeds(running)
        dt = min((s.work / speed[s.rank] for s in running), default=math.inf)
        if self.events and self.events[0][0] <= self.now + dt:
            dt = max(0.0, self.events[0][0] - self.now)
        if any(v < 1.0 for v in speed.values()):
            self.oversubscribed += dt
        self.now += dt
        for s in running:
            s.work -= dt * speed[s.rank]
        for s in running:
            if s.work <= 1e-12:
                self.complete(s)
        while self.events and self.events[0][0] <= self.now + 1e-12:
            _, _, kind, payload = heapq.heappop(self.events)
            if kind == "start":
                self.start_request()
            else:
                self.arrive(*payload)
        return True

    def unstick(self) -> bool:
        """Nothing runs and nothing is due: release the first waiting item without its inputs."""
        for r, left in enumerate(self.left):
            if left:
                for u in range(len(self.flow.units)):
                    if self.check(r, u, force=True):
                        self.forced += 1
                        return True
        return False

    def score(self) -> Score:
        n = max(1, len(self.finished))
        span = (max(self.finished) - min(self.started)) if self.finished else 0.0
        done = self.done_at
        firsts = [max(self.first[r].values(), default=done[r]) - self.started[r] for r in done]
        latency = statistics.median(done[r] - self.started[r] for r in done) if done else None
        ranks = {r: rk for r, rk in self.ranks.items() if r != FRONTEND_RANK}
        unit_busy = {r: {self.flow.units[u].name: b / n for u, b in rk.busy.items()} for r, rk in ranks.items()}
        for r, rk in ranks.items():
            if rk.messages:
                unit_busy[r]["(messages)"] = rk.messages / n
        busy = {r: sum(rk.busy.values()) / n for r, rk in ranks.items()}
        throughput = len(self.finished) / span if span > 0 else math.inf
        utilisation = max(busy.values(), default=0.0) * throughput
        host_bound = span > 0 and self.oversubscribed > 0.5 * span
        return Score(throughput, statistics.median(firsts) if firsts else 0.0, busy, unit_busy, 0,
                     host_bound=host_bound,
                     latency_bound=self.load.rate is None and not host_bound and utilisation < 0.75,
                     latency_s=latency)


def simulate(table: CostTable, graph: WalkGraph, placement: Placement, load: int | Load,
             components: dict[str, ComponentSpec] | None = None, cores: Cores = None,
             worker_threads: int | None = None) -> Score:
    """The placement's throughput, TTFA under load and busiest rank, from a simulated run of the workload."""
    flow = build_flow(table, graph, components or {})
    sc = Simulation(table, flow, graph, placement, Load.of(load), cores, worker_threads).run()
    sc.hops = len(_cross_edges(graph, placement, set(table.nodes)))
    return sc
