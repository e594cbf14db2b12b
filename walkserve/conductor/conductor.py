"""The conductor: owns request state, drives walks through the state machine, watches the workers.

Heartbeat: receive (frontend submissions and aborts, worker reports) ->
admit from the queue -> notice dead workers -> publish status. Outputs for
clients come from workers and leave for the frontend in the same turn.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

import zmq

from walkserve.conductor.admission import Admission
from walkserve.conductor.request_run import RequestRun, safe_advance
from walkserve.conductor.stream_desk import StreamDesk, audio_samples
from walkserve.conductor.supervisor import Supervisor
from walkserve.conductor.timing import RequestTimes
from walkserve.core.errors import WalkserveError
from walkserve.core.finish import FinishReason
from walkserve.core.request import RequestSpec
from walkserve.graph.plan import WalkPlan
from walkserve.graph.walk import WalkGraph
from walkserve.placement.choice import choose_rank
from walkserve.placement.plan import Placement
from walkserve.protocol import messages as m
from walkserve.protocol.run import RunSpec
from walkserve.transport import shm
from walkserve.transport.ipc import Inbox, Outbox

log = logging.getLogger(__name__)

WATCH_S = 0.1  # the workers are looked at this often at least (at once when a pidfd says one exited)

FRONTEND = "frontend"


class Conductor:
    def __init__(self, spec: RunSpec, graph: WalkGraph, placement: Placement):
        self.spec, self.graph, self.placement = spec, graph, placement
        self.ctx = zmq.Context()
        self.inbox = Inbox(self.ctx, spec.conductor_address, spec.token)
        self.outbox = Outbox(self.ctx, spec.token)
        self.outbox.connect(FRONTEND, spec.frontend_address)
        self.supervisor = make_supervisor(spec, placement, self.inbox)
        self.admission = Admission(spec.config.max_running, spec.config.max_waiting)
        self.streams = StreamDesk(spec.config)
        self.runs: dict[str, RequestRun] = {}
        self.timing = RequestTimes() if spec.config.timings else None  # per-request records for traces
        self.ready: dict[int, bool] = {r: False for r in placement.ranks}
        self.addresses: dict[int, str] = {}
        self.nodes: dict[int, str] = {}  # rank -> its node (from Ready): same node, shared memory
        self.direct: dict[int, str] = {}  # rank -> its datagram socket for workers of its node (from Ready)
        self.hosts: dict[int, str] = {}  # rank -> its node's IP (from Ready)
        self.down: dict[int, str] = {}  # ranks that cannot be restarted for now -> why
        self.load: dict[int, int] = defaultdict(int)
        self.state, self.detail = "starting", "starting workers"
        self.counters: dict[str, int] = defaultdict(int)
        self.worker_stats: dict[int, m.RankStats] = {}
        self.started_once = False
        self.draining_until: float | None = None
        self.stopping = False
        self._last_status = 0.0
        self.stats_wait: tuple[set[int], float, int] | None = None
        self._poller: zmq.Poller | None = None
        self._sentinels: set[int] = set()  # worker pidfds registered in the poller
        self._last_watch = 0.0

    # ---- heartbeat ---------------------------------------------------------------------------
    def run(self) -> None:
        shm.sweep()
        for rank in self.placement.ranks:
            self.connect_rank(rank)
        self.start_workers()
        try:
            while not self.stopping:
                if self.poll():
                    self.watch_workers()
                    self.watch_sentinels()
                for msg in self.inbox.receive():
                    self.handle(msg)
                self.admit()
                self.ask_stream_costs()
                self.check_drain()
                self.check_stats_wait()
                self.publish_status()
                self.flush_timing()
                self.outbox.flush()
        finally:
            self.shutdown_workers()

    def start_workers(self) -> None:
        """Start every rank; a placement the cluster cannot meet fails the start with the reason."""
        if self.placement.launcher == "ray":
            self.detail = "reserving every rank's resources in the Ray cluster"
            self.publish_status(force=True)
        try:
            self.supervisor.start_all()
        except Exception as e:  # a placement the cluster cannot meet, no cluster, no zygote, ...
            log.error("the workers could not start: %s", e)
            self.state, self.detail = "failed", str(e) if isinstance(e, WalkserveError) else f"{type(e).__name__}: {e}"
        else:
            self.detail = "starting workers"
        self.publish_status(force=True)

    def poll(self) -> bool:
        """Wait up to 50 ms for a message or a worker's exit; True when the workers are to be looked at:
        a worker's pidfd is readable (it exited), or WATCH_S passed since the last look (ranks without
        a pidfd: Ray actors, a worker that died before its pidfd opened)."""
        if self._poller is None:
            self._poller = zmq.Poller()
            self._poller.register(self.inbox.socket, zmq.POLLIN)
            self.watch_sentinels()
        ready = self._poller.poll(50)
        now = time.monotonic()
        if now - self._last_watch >= WATCH_S or any(fd in self._sentinels for fd, _ in ready):
            self._last_watch = now
            return True
        return False

    def watch_sentinels(self) -> None:
        """The poller watches the pidfds of the workers running now."""
        fds = set(self.supervisor.sentinels())
        for fd in self._sentinels - fds:
            self._poller.unregister(fd)
        for fd in fds - self._sentinels:
            self._poller.register(fd, zmq.POLLIN)
        self._sentinels = fds

    def handle(self, msg: Any) -> None:
        handler = self._handlers.get(type(msg))
        if handler is None:
            log.warning("conductor ignores %s", type(msg).__name__)
            return
        handler(self, msg)

    # ---- frontend messages -------------------------------------------------------------------
    def on_submit(self, msg: m.Submit) -> None:
        spec = msg.request
        if self.state in ("draining", "stopped", "failed"):
            self.outbox.put(FRONTEND, m.Rejected(spec.id, f"the server is {self.state}", 5.0, cause="draining"))
            return
        unknown = sorted(set(spec.node_sampling) - set(self.graph.node_names()))
        if unknown:
            message = f"node_sampling names {unknown[0]!r}, which is no node of this model ({', '.join(self.graph.node_names())})"
            self.outbox.put(FRONTEND, m.Rejected(spec.id, message, invalid=True))
            return
        if self.down:
            self.counters["failed"] += 1
            self.outbox.put(FRONTEND, m.Finished(spec.id, FinishReason.ERROR.value, error=self.down_message()))
            return
        if spec.realtime and self.streams.by_capacity:
            self.submit_stream(spec)
            return
        decision = self.admission.decide(len(self.runs))
        if decision == "reject":
            self.counters["rejected"] += 1
            retry = self.admission.retry_after()
            self.outbox.put(FRONTEND, m.Rejected(spec.id, "too many requests: the queue is full", retry))
        elif decision == "run" and self.state == "ready":
            self.start_request(spec, time.monotonic())
        else:
            self.admission.enqueue(spec)

    def submit_stream(self, spec: RequestSpec) -> None:
        """A real-time stream: admitted while the runtime keeps every stream ahead of playback (StreamDesk)."""
        now = time.monotonic()
        decision = self.streams.decide(now)
        if decision.action == "reject":
            self.reject_stream(spec, decision.retry_after_s)
        elif decision.action == "run" and self.state == "ready" and self.admission.decide(len(self.runs)) == "run":
            self.counters["streams_admitted"] += 1
            self.start_request(spec, now)
        else:
            self.streams.admission.enqueue(spec, now)

    def reject_stream(self, spec: RequestSpec, retry_after_s: float) -> None:
        self.counters["rejected"] += 1
        self.counters["streams_rejected_capacity"] += 1
        message = "too many streams: another one would not stay real-time"
        self.outbox.put(FRONTEND, m.Rejected(spec.id, message, retry_after_s, cause="capacity"))

    def on_abort(self, msg: m.Abort) -> None:
        if self.admission.remove(msg.request_id) or self.streams.admission.remove(msg.request_id):
            self.counters["aborted"] += 1
            self.outbox.put(FRONTEND, m.Finished(msg.request_id, FinishReason.ABORT.value))
            return
        run = self.runs.get(msg.request_id)
        if run is not None:
            self.finish(run, FinishReason.STOP if msg.reason == FinishReason.STOP.value else FinishReason.ABORT)

    def on_shutdown(self, msg: m.Shutdown) -> None:
        self.state, self.detail = "draining", "shutting down"
        self.draining_until = time.monotonic() + msg.drain_s
        for spec, _ in [*self.admission.queue, *self.streams.admission.waiting]:
            self.admission.remove(spec.id) or self.streams.admission.remove(spec.id)
            self.outbox.put(FRONTEND, m.Finished(spec.id, FinishReason.ABORT.value, error="the server is shutting down"))
        self.publish_status(force=True)

    def on_status_query(self, msg: m.StatusQuery) -> None:
        """Ask every live worker for fresh counters; publish once they answered (or after 0.3 s)."""
        live = [r for r, ok in self.ready.items() if ok]
        for rank in live:
            self.outbox.put(("rank", rank), m.StatsQuery())
        self.stats_wait = (set(live), time.monotonic() + 0.3, msg.query_id)
        self.check_stats_wait()

    def check_stats_wait(self) -> None:
        if self.stats_wait is not None and (not self.stats_wait[0] or time.monotonic() > self.stats_wait[1]):
            query_id = self.stats_wait[2]
            self.stats_wait = None
            self.publish_status(force=True, query_id=query_id)

    # ---- requests ----------------------------------------------------------------------------
    def start_request(self, spec: RequestSpec, queued_at: float) -> None:
        def choose(plan: WalkPlan, node: str, sticky: dict[str, int]) -> int:
            return choose_rank(self.placement, plan, node, sticky, self.load.__getitem__)

        run = RequestRun(spec, self.graph, choose, stateful=frozenset(self.spec.stateful))
        run.admitted_at = queued_at
        run.queue_s = time.monotonic() - queued_at
        self.runs[spec.id] = run
        started_ns = time.time_ns() if self.timing is not None else 0
        self.streams.started(spec, run.admitted_at)
        messages, error = safe_advance(run, run.begin)
        if error is not None:
            self.finish(run, FinishReason.ERROR, error)
            return
        self.send_walk(run, messages)
        if self.timing is not None:
            self.timing.admitted(spec.id, run.queue_s, started_ns)

    def send_walk(self, run: RequestRun, messages: list) -> None:
        for rank, msg in messages:  # StartWalk, and MoveContexts first when a component's state moves
            self.outbox.put(("rank", rank), msg)
        self.counters["start_walks"] += sum(isinstance(msg, m.StartWalk) for _, msg in messages)
        if self.timing is not None:
            self._time_walk(run.id, [msg for _, msg in messages if isinstance(msg, m.StartWalk)])
        self.unload(run)
        run.loaded = {r for r, msg in messages if isinstance(msg, m.StartWalk)}
        for rank in run.loaded:
            self.load[rank] += 1

    def unload(self, run: RequestRun) -> None:
        for rank in run.loaded:
            self.load[rank] -= 1
        run.loaded = set()

    def on_client_outs(self, msg: m.ClientOuts) -> None:
        """A cohort step's outputs: numbered per request, passed on as one message (-1: request gone)."""
        key, runs, indices = (msg.modality, msg.output), self.runs, []
        for rid in msg.request_ids:
            run = runs.get(rid)
            indices.append(-1 if run is None else run.next_index(key))
        if msg.modality == "audio":
            self.count_audio(msg)
        self.outbox.put(FRONTEND, m.Events(msg.walk, msg.node, msg.modality, msg.output, msg.request_ids, msg.paths, indices, msg.stacked, msg.values))

    def count_audio(self, msg: m.ClientOuts) -> None:
        now = time.monotonic()
        for rid, samples in zip(msg.request_ids, audio_samples(msg)):
            run = self.runs.get(rid)
            if run is not None:
                first = not run.audio_seen
                run.audio_seen = True
                self.streams.on_audio(run.spec, samples, first, now, now - run.admitted_at - run.queue_s)

    def on_walk_out(self, msg: m.WalkOut) -> None:
        run = self.runs.get(msg.request_id)
        if run is not None and run.walk_output(msg.walk, msg.name, msg.value):
            self.advance(run)

    def on_node_done(self, msg: m.NodeDone) -> None:
        run = self.runs.get(msg.request_id)
        if run is not None and run.node_done(msg.walk, msg.nodes, msg.firings, msg.hit_bound):
            self.advance(run)

    def on_walk_started(self, msg: m.WalkStarted) -> None:
        """A rank went on to the request's next walk by itself (it held every node of both walks)."""
        run = self.runs.get(msg.request_id)
        if run is not None and run.walk_started(msg.finished, msg.firings, msg.walk, msg.ranks):
            self.counters["walks_started_by_workers"] += 1
            if self.timing is not None:
                self.timing.walk(run.id, msg.walk, msg.ranks)

    def advance(self, run: RequestRun) -> None:
        messages, error = safe_advance(run, run.advance)
        if error is not None:
            self.finish(run, FinishReason.ERROR, error)
        elif run.finished is not None:
            self.finish(run, run.finished)
        else:
            self.send_walk(run, messages)

    def on_rank_failed(self, msg: m.RankFailed) -> None:
        self.state, self.detail = "failed", msg.reason
        self.publish_status(force=True)

    def on_failed(self, msg: m.Failed) -> None:
        run = self.runs.get(msg.request_id)
        if run is not None:
            self.finish(run, FinishReason.ERROR, msg.error)

    def finish(self, run: RequestRun, reason: FinishReason, error: str | None = None) -> None:
        self.runs.pop(run.id, None)
        self.unload(run)
        self.streams.ended(run.id, reason == FinishReason.LENGTH)
        now = time.monotonic()
        timings = {"queue_s": getattr(run, "queue_s", 0.0), "total_s": now - run.admitted_at}
        if run.first_output_at is not None:
            timings["first_output_s"] = run.first_output_at - run.admitted_at
        usage = {"firings": run.firings}
        for (modality, _), n in run.seq.items():  # outputs per modality, whichever node output carried them
            usage[f"{modality}_outputs"] = usage.get(f"{modality}_outputs", 0) + n
        key = {FinishReason.ERROR: "failed", FinishReason.ABORT: "aborted"}.get(reason, "finished")
        self.counters[key] += 1
        if self.timing is not None:
            self.timing.end(run.id)
            self.flush_timing()
        self.outbox.put(FRONTEND, m.Finished(run.id, reason.value, error, usage, timings))
        for rank in run.involved_ranks():
            self.outbox.put(("rank", rank), m.Release(run.id))

    def _time_walk(self, rid: str, starts: list[m.StartWalk]) -> None:
        if starts:
            self.timing.walk(rid, starts[0].walk, {n: r for s in starts for n, r in s.ranks.items()})

    def on_timings(self, msg: m.Timings) -> None:
        """A worker's timing records go on to the frontend in order (before the ends they preceded)."""
        self.outbox.put(FRONTEND, msg)

    def flush_timing(self) -> None:
        timings = self.timing.take() if self.timing is not None else None
        if timings is not None:
            self.outbox.put(FRONTEND, timings)

    def admit(self) -> None:
        if self.state not in ("ready",):
            return
        self.streams.admission.tick(time.monotonic())
        while (item := self.admission.next_ready(len(self.runs))) is not None:
            self.start_request(*item)
        for spec in self.streams.admission.expired(time.monotonic()):
            self.reject_stream(spec, self.streams.admission.retry_after(time.monotonic()))
        while len(self.runs) < self.spec.config.max_running and (item := self.streams.admission.next_ready()):
            self.counters["streams_admitted"] += 1
            self.start_request(*item)

    def ask_stream_costs(self) -> None:
        """While streams run, the ranks report their counters every STATS_EVERY_S (the step costs' source)."""
        if self.state == "ready" and self.streams.due_stats(time.monotonic()):
            for rank, ok in self.ready.items():
                if ok:
                    self.outbox.put(("rank", rank), m.StatsQuery())

    # ---- workers -----------------------------------------------------------------------------
    def on_ready(self, msg: m.Ready) -> None:
        self.ready[msg.rank] = True
        self.addresses[msg.rank] = msg.address
        self.nodes[msg.rank], self.hosts[msg.rank] = msg.node, msg.host
        if msg.direct:
            self.direct[msg.rank] = msg.direct
        else:
            self.direct.pop(msg.rank, None)
        self.down.pop(msg.rank, None)
        if self.placement.ranks[msg.rank].transport == "tcp":
            self.outbox.connect(("rank", msg.rank), msg.address)
        log.info("rank %d ready (pid %d, %s)", msg.rank, msg.pid, msg.address)
        if all(self.ready.values()):
            for rank in self.placement.ranks:
                self.outbox.put(("rank", rank), m.Peers(dict(self.addresses), dict(self.nodes), dict(self.direct)))
            if self.state in ("starting", "degraded"):
                self.state, self.detail = "ready", "serving"
            self.started_once = True
            self.publish_status(force=True)

    def connect_rank(self, rank: int) -> None:
        """IPC ranks have a fixed address; a TCP rank is connected when its Ready names its port."""
        if self.placement.ranks[rank].transport == "ipc":
            self.outbox.connect(("rank", rank), self.spec.address(f"rank{rank}"))

    def watch_workers(self) -> None:
        for rank, why in self.supervisor.dead():
            self.ready[rank] = False
            message = f"worker rank {rank} died ({why})"
            log.error(message)
            if not self.started_once:
                self.state, self.detail = "failed", f"{message} while starting"
                self.supervisor.forget(rank)
                self.publish_status(force=True)
                continue
            for run in [r for r in self.runs.values() if rank in r.involved_ranks()]:
                self.finish(run, FinishReason.ERROR, message)
            if self.spec.config.restart_workers and not self.stopping and self.state != "draining":
                self.state, self.detail = "degraded", f"{message}; restarting it"
                self.supervisor.restart(rank)
                self.connect_rank(rank)
            else:
                self.supervisor.forget(rank)
                self.state, self.detail = "degraded", message
            self.publish_status(force=True)
        for rank, why in self.supervisor.lost():
            self.rank_down(rank, why)

    def rank_down(self, rank: int, why: str) -> None:
        """A rank that cannot come back for now (its node is gone): degraded, and requests fail instead of waiting."""
        self.down[rank] = f"worker rank {rank} {why}"
        log.error(self.down[rank])
        self.state = "failed" if not self.started_once else "degraded"
        self.detail = self.down_message()
        for spec, _ in [*self.admission.queue, *self.streams.admission.waiting]:
            self.admission.remove(spec.id) or self.streams.admission.remove(spec.id)
            self.counters["failed"] += 1
            self.outbox.put(FRONTEND, m.Finished(spec.id, FinishReason.ERROR.value, error=self.detail))
        self.publish_status(force=True)

    def down_message(self) -> str:
        return "; ".join(self.down[r] for r in sorted(self.down))

    def on_worker_stats(self, msg: m.WorkerStats) -> None:
        self.worker_stats[msg.rank] = msg.stats
        self.streams.on_rank_stats(msg.rank, msg.stats)
        if self.stats_wait is not None:
            self.stats_wait[0].discard(msg.rank)

    def check_drain(self) -> None:
        if self.draining_until is None:
            return
        if self.runs and time.monotonic() < self.draining_until:
            return
        for run in list(self.runs.values()):
            self.finish(run, FinishReason.ABORT, "the server shut down before this request finished")
        self.stopping = True

    def shutdown_workers(self) -> None:
        for rank in self.placement.ranks:
            self.outbox.put(("rank", rank), m.Stop())
        self.state, self.detail = "stopped", "stopped"
        self.publish_status(force=True)
        self.outbox.flush()
        self.supervisor.stop_all()
        shm.sweep(self.spec.run_id)
        self.inbox.close()
        self.outbox.close()
        self.ctx.term()

    # ---- status ------------------------------------------------------------------------------
    def publish_status(self, force: bool = False, query_id: int = 0) -> None:
        now = time.monotonic()
        if not force and now - self._last_status < self.spec.config.status_interval_s:
            return
        self._last_status = now
        stats = m.RuntimeSnapshot(
            running=len(self.runs),
            waiting=len(self.admission.queue) + len(self.streams.admission.waiting),
            counters=dict(self.counters),
            workers=dict(self.worker_stats),
            restarts=dict(self.supervisor.restarts),
            pids=self.supervisor.pids(),
            zygote_pid=self.supervisor.zygote.popen.pid if self.supervisor.zygote else None,
            hosts=dict(self.hosts),
            nodes=dict(self.nodes),
            launcher=self.placement.launcher,
            ray=self.supervisor.describe(),
            streams=self.streams.snapshot(),
        )
        alive = {r: bool(self.ready.get(r)) for r in self.placement.ranks}
        self.outbox.put(FRONTEND, m.Status(self.state, self.detail, alive, stats, query_id))

    _handlers = {
        m.Submit: on_submit,
        m.Abort: on_abort,
        m.Shutdown: on_shutdown,
        m.StatusQuery: on_status_query,
        m.ClientOuts: on_client_outs,
        m.WalkOut: on_walk_out,
        m.NodeDone: on_node_done,
        m.WalkStarted: on_walk_started,
        m.Failed: on_failed,
        m.RankFailed: on_rank_failed,
        m.Ready: on_ready,
        m.WorkerStats: on_worker_stats,
        m.Timings: on_timings,
    }


def make_supervisor(spec: RunSpec, placement: Placement, inbox: Inbox):
    """Local workers (forked from a zygote on this host), or Ray actors for a ``launcher: ray`` placement."""
    if placement.launcher == "ray":
        from walkserve.conductor.ray_supervisor import RaySupervisor

        return RaySupervisor(spec, placement, inbox)
    return Supervisor(spec.address_path("spec.msgpack"), sorted(placement.ranks), spec.config.start_timeout_s,
                      spec.config.worker_environ())
