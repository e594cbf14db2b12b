"""The worker: one process per rank, a heartbeat of receive -> collect -> hand over -> housekeeping -> flush.

    receive       apply messages: start walks, deliveries, stream items, loop events, releases;
                  each walk dataflow then fires what is ready (Firings with Futures)
    collect       results from the compute thread go back into their dataflows, which fire on
    hand over     the turn's firings go to the compute thread together
    housekeeping  stats to the conductor, expired early messages and finished walks dropped
    flush         queued outputs leave: other ranks (shared memory for big tensors), the conductor

A failing request becomes a Failed report for that request; nothing a
request does unwinds this loop.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import defaultdict
from typing import Any

import torch
import zmq

from walkserve.core.sampling import SamplingParams
from walkserve.engines.base import Firing, FiringResult
from walkserve.engines.values import concat
from walkserve.graph.walk import WalkGraph
from walkserve.protocol import messages as m
from walkserve.protocol.run import RankSite, RunSpec
from walkserve.transport.ipc import Inbox, Outbox
from walkserve.transport.tensors import TensorCodec, stack_rows, unpack
from walkserve.worker.cohort import CohortReport, Member
from walkserve.worker.cohort_plan import CohortPlan
from walkserve.worker.compute import ComputeThread, Future
from walkserve.worker.dataflow import WalkState

log = logging.getLogger(__name__)

CONDUCTOR = "conductor"
EARLY_TTL_S = 30.0
STATS_INTERVAL_S = 0.5


class Worker:
    def __init__(self, spec: RunSpec, rank: int, graph: WalkGraph, engines: dict, site: RankSite):
        self.spec, self.rank, self.graph, self.site = spec, rank, graph, site
        self.ctx = zmq.Context()
        self.nodes: dict[int, str] = {}  # peer rank -> its node (Peers); same node as ours: shared memory
        self.inbox = Inbox(self.ctx, site.inbox, spec.token)
        self.outbox = Outbox(self.ctx, spec.token)
        self.outbox.connect(CONDUCTOR, site.conductor)
        self.codec = TensorCodec(site.shm_id or spec.run_id, f"r{rank}")
        self.compute = ComputeThread(engines)
        self.engines = engines
        self.walks: dict[tuple[str, str], WalkState] = {}
        self.sampling: dict[str, SamplingParams] = {}
        self.node_sampling: dict[str, dict[str, SamplingParams]] = {}  # request -> node -> its own sampling
        self.early: dict[tuple[str, str], list[tuple[float, Any]]] = defaultdict(list)
        self.released: dict[str, float] = {}
        self.inflight: dict[int, tuple[WalkState, str, tuple[int, ...], str]] = {}
        self.deferred: list[tuple[WalkState, str, tuple[int, ...], dict]] = []
        self.to_compute: list[tuple[str, Firing, dict]] = []
        self.ids = itertools.count()
        self.stopping = False
        self.counters = defaultdict(int)
        self.shm_to: dict[int, int] = defaultdict(int)  # tensors sent through shared memory, per rank
        self.inline_to: dict[int, int] = defaultdict(int)  # tensors sent inside frames, per rank
        self._last_stats = 0.0
        self._last_sweep = time.monotonic()

    # ---- the heartbeat -----------------------------------------------------------------------
    def run(self) -> None:
        self.compute.start()
        ready = m.Ready(self.rank, os.getpid(), self.inbox.address, node=self.site.node, host=self.site.host)
        self.outbox.send_now(CONDUCTOR, ready)
        poller = zmq.Poller()
        poller.register(self.inbox.socket, zmq.POLLIN)
        poller.register(self.compute.notify_fd, zmq.POLLIN)
        try:
            while not self.stopping:
                poller.poll(100)
                self.receive()
                self.collect()
                self.hand_over()
                self.housekeeping()
                self.outbox.flush()
        finally:
            self.compute.stop()
            self.outbox.flush()
            self.inbox.close()
            self.outbox.close()
            self.ctx.term()

    def receive(self) -> None:
        for msg in self.inbox.receive():
            handler = self._handlers.get(type(msg))
            if handler is None:
                log.warning("rank %d ignores %s", self.rank, type(msg).__name__)
                continue
            handler(self, msg)
            self.run_deferred()

    def collect(self) -> None:
        cohorts: dict[tuple[str, str], CohortReport] = {}  # several steps of one cohort, merged in order
        for component, result in self.compute.collect():
            if isinstance(result, CohortReport):
                merged = cohorts.get((result.walk, result.scope))
                if merged is None:
                    cohorts[(result.walk, result.scope)] = result
                else:
                    merged.merge(result)
                continue
            if isinstance(result, str):
                self._engine_failed(component, result)
            else:
                self._result(result)
            self.run_deferred()
        for report in cohorts.values():
            self._cohort_report(report)
            self.run_deferred()

    def run_deferred(self) -> None:
        """Let local consumers see launched firings' futures, then hand the turn's firings over at once.

        Handing a whole turn's firings to the compute thread together keeps one
        engine step from seeing only the first few of a batch.
        """
        while self.deferred:
            ws, node, path, futures = self.deferred.pop(0)
            if not ws.failed and (ws.request_id, ws.walk) in self.walks:
                ws.launched(node, path, futures)

    def hand_over(self) -> None:
        if self.to_compute:
            self.compute.fire_many(self.to_compute)
            self.to_compute = []

    # ---- messages ----------------------------------------------------------------------------
    def on_start(self, msg: m.StartWalk) -> None:
        rid = msg.request_id
        if rid in self.released:
            return
        if rid not in self.sampling:
            self.sampling[rid] = msg.sampling
            if msg.node_sampling:
                self.node_sampling[rid] = msg.node_sampling
        plan = self.graph.plans[msg.walk]
        config = self.spec.config
        ws = WalkState(plan, rid, self.rank, msg.ranks, msg.params, self, concat, config.speculation, config.cohorts)
        self.walks[(rid, msg.walk)] = ws
        ws.start({k: self._value(v) for k, v in msg.inputs.items()})
        for _, early in self.early.pop((rid, msg.walk), []):
            self._apply(ws, early)

    def on_peer_message(self, msg: Any) -> None:
        key = (msg.request_id, msg.walk)
        if msg.request_id in self.released:
            return
        ws = self.walks.get(key)
        if ws is None:
            self.early[key].append((time.monotonic(), msg))
        else:
            self._apply(ws, msg)

    def _apply(self, ws: WalkState, msg: Any) -> None:
        if isinstance(msg, m.Deliver):
            ws.deliver(msg.node, msg.output, msg.path, self._value(msg.value))
        elif isinstance(msg, m.StreamItem):
            ws.stream_item(msg.stream, msg.prefix, msg.index, self._value(msg.value))
        elif isinstance(msg, m.StreamEnd):
            ws.stream_end(msg.stream, msg.prefix, msg.n_items)
        elif isinstance(msg, m.LoopEvent):
            ws.loop_event(msg.scope, msg.outer, msg.k, msg.end)
        elif isinstance(msg, m.Flow):
            ws.flow(msg.stream, msg.prefix, msg.pause)

    def on_release(self, msg: m.Release) -> None:
        rid = msg.request_id
        self.released[rid] = time.monotonic()
        for key in [k for k in self.walks if k[0] == rid]:
            del self.walks[key]
        for key in [k for k in self.early if k[0] == rid]:
            del self.early[key]
        self.sampling.pop(rid, None)
        self.node_sampling.pop(rid, None)
        for fid in [f for f, rec in self.inflight.items() if rec[0].request_id == rid]:
            del self.inflight[fid]
        self.to_compute = [item for item in self.to_compute if item[1].request_id != rid]
        self.compute.release(rid)
        # report soon, so observers see the state freed without waiting a whole stats period
        self._last_stats = min(self._last_stats, time.monotonic() - STATS_INTERVAL_S + 0.05)

    def on_peers(self, msg: m.Peers) -> None:
        self.nodes = dict(msg.nodes)
        for rank, address in msg.addresses.items():
            if self.outbox.addresses.get(("rank", rank)) != address or rank == self.rank:
                self.outbox.connect(("rank", rank), address)

    def on_stop(self, msg: m.Stop) -> None:
        self.stopping = True

    def on_stats_query(self, msg: m.StatsQuery) -> None:
        self._send_stats()

    _handlers = {
        m.StartWalk: on_start,
        m.Deliver: on_peer_message,
        m.StreamItem: on_peer_message,
        m.StreamEnd: on_peer_message,
        m.LoopEvent: on_peer_message,
        m.Flow: on_peer_message,
        m.Release: on_release,
        m.Peers: on_peers,
        m.Stop: on_stop,
        m.StatsQuery: on_stats_query,
    }

    # ---- the dataflow sink -------------------------------------------------------------------
    def fire(
        self, ws: WalkState, node: str, path: tuple, inputs: dict, spans: dict, speculative: bool
    ) -> None:
        gnode = ws.plan.nodes[node]
        firing = Firing(
            id=next(self.ids),
            request_id=ws.request_id,
            walk=ws.walk,
            node=node,
            component=gnode.component,
            op=gnode.op,
            path=path,
            inputs=inputs,
            outputs=gnode.outputs,
            params=ws.params,
            sampling=self._sampling(ws.request_id, node),
            node_params=gnode.params,
            spans=spans,
        )
        futures = {out: Future() for out in gnode.outputs}
        self.inflight[firing.id] = (ws, node, path, gnode.component)
        self.counters["firings"] += 1
        self.counters["speculative"] += int(speculative)
        self.to_compute.append((gnode.component, firing, futures))
        self.deferred.append((ws, node, path, futures))

    def join(self, ws: WalkState, plan: CohortPlan, outer: tuple, bound: int, entry: dict) -> None:
        """A loop instance goes to its cohort in the compute thread."""
        rid = ws.request_id
        member = Member(rid, outer, bound, ws.params, self.sampling.get(rid), entry, self.node_sampling.get(rid))
        self.compute.join(plan, member)

    def _sampling(self, rid: str, node: str) -> SamplingParams | None:
        """The node's own sampling for the request, else the request's."""
        own = self.node_sampling.get(rid)
        return own[node] if own and node in own else self.sampling.get(rid)

    def send(self, rank: int, kind: str, ws: WalkState, **f: Any) -> None:
        rid, walk = ws.request_id, ws.walk
        inline = self.nodes.get(rank) != self.site.node  # another node, or not known yet: inside the frame
        if kind == "deliver":
            msg = m.Deliver(
                rid, walk, f["node"], f["output"], f["path"], self._to_peer(rank, f["value"], inline)
            )
        elif kind == "item":
            msg = m.StreamItem(
                rid, walk, f["stream"], f["prefix"], f["index"], self._to_peer(rank, f["value"], inline)
            )
        elif kind == "end":
            msg = m.StreamEnd(rid, walk, f["stream"], f["prefix"], f["n_items"])
        elif kind == "loop":
            msg = m.LoopEvent(rid, walk, f["scope"], f["outer"], f["k"], f["end"])
        else:
            msg = m.Flow(rid, walk, f["stream"], f["prefix"], f["pause"])
        self.outbox.put(("rank", rank), msg)

    def report(self, kind: str, ws: WalkState, **f: Any) -> None:
        rid, walk = ws.request_id, ws.walk
        if kind == "client":
            msg = m.ClientOut(
                rid,
                walk,
                f["node"],
                f["modality"],
                f["path"],
                self._wire(f["value"], inline=True),
                f.get("output", ""),
            )
        elif kind == "output":
            msg = m.WalkOut(rid, walk, f["name"], self._wire(f["value"], inline=True))
        elif kind == "done":
            msg = m.NodeDone(rid, walk, f["node"], f["firings"], f["hit_bound"])
            self.counters["wasted"] += sum(ws.wasted.values()) if ws.is_done() else 0
        else:
            msg = m.Failed(rid, f["error"])
        self.outbox.put(CONDUCTOR, msg)

    # ---- results -----------------------------------------------------------------------------
    def _result(self, result: FiringResult) -> None:
        record = self.inflight.pop(result.firing.id, None)
        if record is None:
            return  # the request was released meanwhile
        ws, node, path, _ = record
        if (ws.request_id, ws.walk) not in self.walks or ws.failed:
            return
        if result.error is not None:
            ws.failed = True
            self.outbox.put(CONDUCTOR, m.Failed(ws.request_id, result.error))
            return
        ws.completed(node, path, result.outputs)

    def _cohort_report(self, report: CohortReport) -> None:
        """Cohort steps: exposed outputs (one message per node output), failed members, ended loops, in that order."""
        walks, walk = self.walks, report.walk
        self.counters["firings"] += report.firings
        self.counters["cohort_firings"] += report.firings
        for (node, out, modality), (rids, paths, values) in report.client.items():
            keep = [i for i, rid in enumerate(rids) if (ws := walks.get((rid, walk))) is not None and not ws.failed]
            if len(keep) < len(rids):
                rids, paths, values = [rids[i] for i in keep], [paths[i] for i in keep], [values[i] for i in keep]
            if rids:
                msg = m.ClientOuts(walk, node, modality, out, rids, paths)
                stack = stack_rows(values)
                if stack is not None:
                    msg.stacked = self.codec.pack(stack, allow_shm=False)
                else:
                    msg.values = [self._wire(v, inline=True) for v in values]
                self.outbox.put(CONDUCTOR, msg)
        for rid, error in report.failed:
            ws = walks.get((rid, walk))
            if ws is not None and not ws.failed:
                ws.failed = True
                self.outbox.put(CONDUCTOR, m.Failed(rid, error))
        for rid, outer, n, fired, hit_bound, exits in report.ended:
            ws = walks.get((rid, walk))
            if ws is not None:
                ws.cohort_ended(report.scope, outer, n, fired, hit_bound, exits)

    def _engine_failed(self, component: str, error: str) -> None:
        failed = {rec[0].request_id for rec in self.inflight.values() if rec[3] == component}
        for rid in failed:
            self.outbox.put(CONDUCTOR, m.Failed(rid, error))

    # ---- values ------------------------------------------------------------------------------
    def _wire(self, value: Any, inline: bool = False) -> Any:
        if isinstance(value, torch.Tensor):
            return self.codec.pack(value, allow_shm=not inline)
        return value

    def _to_peer(self, rank: int, value: Any, inline: bool) -> Any:
        """A value for another rank; tensors are counted per destination by the path they take."""
        wire = self._wire(value, inline)
        if isinstance(wire, m.TensorMsg):
            (self.inline_to if wire.shm is None else self.shm_to)[rank] += 1
        return wire

    @staticmethod
    def _value(value: Any) -> Any:
        return unpack(value) if isinstance(value, m.TensorMsg) else value

    # ---- housekeeping ------------------------------------------------------------------------
    def housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._last_stats >= STATS_INTERVAL_S:
            self._last_stats = now
            self._send_stats()
        if now - self._last_sweep >= 1.0:
            self._last_sweep = now
            for key in [k for k, v in self.early.items() if v and now - v[0][0] > EARLY_TTL_S]:
                del self.early[key]
            for rid in [r for r, t in self.released.items() if now - t > 2 * EARLY_TTL_S]:
                del self.released[rid]
            for key in [
                k for k, ws in self.walks.items() if ws.is_done() and not self._has_inflight(ws)
            ]:
                del self.walks[key]

    def _has_inflight(self, ws: WalkState) -> bool:
        return any(rec[0] is ws for rec in self.inflight.values())

    def _send_stats(self) -> None:
        engines = {}
        state = 0
        counted: set[int] = set()  # a KV share group's one engine serves several components: count it once
        for name, engine in self.engines.items():
            try:
                engines[name] = dict(engine.stats())
                if id(engine) not in counted:
                    state += engine.state_count()
                    counted.add(id(engine))
            except Exception:
                engines[name] = {}
        nodes: dict[str, dict[str, float]] = {}
        for name, engine in self.engines.items():
            per_node = getattr(engine, "node_stats", None)
            if per_node:
                for node, s in per_node.items():
                    nodes[node] = dict(s)
            elif self.compute.steps.get(name):  # engines that batch across nodes: per component
                c = self.compute
                nodes[name] = {
                    "batches": c.steps[name],
                    "items": c.items[name],
                    "busy_s": c.busy_s[name],
                }
        stats = m.RankStats(
            walk_states=len(self.walks),
            requests=len({k[0] for k in self.walks}),
            engine_state=state,
            inflight=len(self.inflight),
            cohort_members=self.compute.cohort_members(),
            early=sum(len(v) for v in self.early.values()),
            counters=dict(self.counters),
            engines=engines,
            nodes=nodes,
            busy_s=dict(self.compute.busy_s),
            steps=dict(self.compute.steps),
            shm_sent=self.codec.shm_sent,
            shm_to=dict(self.shm_to),
            inline_to=dict(self.inline_to),
            address=self.inbox.address,
            node=self.site.node,
            host=self.site.host,
            bad_frames=self.inbox.bad_frames,
        )
        self.outbox.put(CONDUCTOR, m.WorkerStats(self.rank, stats))
