"""The worker: one process per rank, one thread, a heartbeat of receive -> advance -> send -> housekeeping.

    receive       frames from the conductor and other ranks: decoded, tensors unpacked,
                  applied to the executor (walks to start, rows of batched messages, releases)
    advance       one pass of every cohort that may move, each engine called with its
                  groups (``executor``, ``cohort``); a cohort that decided its step hands
                  its rows for other ranks off at once (``_hand_off``), mid-pass
    send          what the executor produced, tensors packed for each destination; other
                  ranks' frames first, then the conductor's
    housekeeping  this rank's counters every half second; rows that waited too long dropped

The loop polls its inbox without waiting while the executor has work and
sleeps in the poll when it has none, so a message from another rank is
picked up by the thread that acts on it: no hand-over between threads on
the way from one rank's step to the next's. A failing request becomes a
Failed report for that request; nothing a request does unwinds this loop.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import defaultdict

import zmq

from walkserve.engines.base import Engine
from walkserve.engines.values import concat, to_array, to_tensor
from walkserve.graph.walk import WalkGraph
from walkserve.placement.plan import Placement
from walkserve.protocol import messages as m
from walkserve.protocol.run import RankSite, RunSpec
from walkserve.protocol.timing import TimingLog
from walkserve.transport.ipc import Inbox, Outbox
from walkserve.transport.tensors import TensorCodec
from walkserve.worker.executor import Executor
from walkserve.worker.outgoing import CONDUCTOR
from walkserve.worker.wire import pack, unpack_message

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
SWEEP_S = 1.0
IDLE_POLL_MS = 100
BACKLOG_POLL_MS = 1  # frames wait for a peer's full queue: retry soon


class Worker:
    def __init__(
        self, spec: RunSpec, rank: int, graph: WalkGraph, engines: dict[str, Engine], site: RankSite,
        placement: Placement,
    ):
        self.spec, self.rank, self.site = spec, rank, site
        self.nodes: dict[int, str] = {}  # peer rank -> its node (Peers); same node as ours: shared memory
        self.ctx = zmq.Context()
        self.inbox = Inbox(self.ctx, site.inbox, spec.token)
        self.outbox = Outbox(self.ctx, spec.token)
        self.outbox.connect(CONDUCTOR, site.conductor)
        self.direct = self._listen_direct() if spec.config.direct_peers else ""
        self.codec = TensorCodec(site.shm_id or spec.run_id, f"r{rank}")
        self.shm_to: dict[int, int] = defaultdict(int)  # tensors sent through shared memory, per rank
        self.inline_to: dict[int, int] = defaultdict(int)  # tensors sent inside frames, per rank
        self.sent_to: dict[int, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])  # messages, tensors, bytes, pack s
        self.executor = Executor(
            rank, graph, engines, concat, placement, batched=spec.config.cohorts, convert=(to_array, to_tensor),
            scheduling=spec.config.stream_scheduling, split_steps=spec.config.split_steps,
        )
        self.executor.fx.hand_off = self._hand_off  # a step's rows for other ranks may leave mid-pass
        self.timing = TimingLog(rank) if spec.config.timings else None  # firings and transfers, per request
        self.executor.engine_set.timing = self.timing
        self.stopping = False
        self.busy = False  # the executor may move without a new message
        self._last_stats = 0.0
        self._last_sweep = time.monotonic()
        self._born, self.idle_s = time.perf_counter(), 0.0  # the loop's time, and the part it waited for messages

    # ---- the heartbeat -----------------------------------------------------------------------
    def run(self) -> None:
        ready = m.Ready(self.rank, os.getpid(), self.inbox.address, node=self.site.node, host=self.site.host,
                        direct=self.direct)
        self.outbox.send_now(CONDUCTOR, ready)
        try:
            while not self.stopping:
                self.receive()
                self.advance()
                self.send()
                self.housekeeping()
        finally:
            self.close_engines()
            self.outbox.flush()
            self.inbox.close()
            self.outbox.close()
            self.ctx.term()

    def close_engines(self) -> None:
        """Engine.close, once per engine, after its last step (the worker is shutting down)."""
        for engine in {id(e): e for e in self.executor.engines.values()}.values():
            try:
                engine.close()
            except Exception:
                log.exception("engine %s failed to close", engine.component)

    def receive(self) -> None:
        """What has arrived; when the executor has nothing to do, wait for it in the poll (idle time)."""
        if not self.busy:
            t0 = time.perf_counter()
            arrived = self.inbox.poll(BACKLOG_POLL_MS if self.outbox.backlog else IDLE_POLL_MS)
            self.idle_s += time.perf_counter() - t0
            if not arrived:
                return
        ex = self.executor
        for msg in self.inbox.receive():
            if isinstance(msg, m.Peers):
                self.on_peers(msg)
            elif isinstance(msg, m.Stop):
                self.stopping = True
            elif type(msg) in ex.handles:
                try:
                    ex.receive(unpack_message(msg))
                except Exception:
                    log.exception("rank %d failed on %s", self.rank, type(msg).__name__)
                if isinstance(msg, m.Release):
                    self._stats_soon()
            else:
                log.warning("rank %d ignores %s", self.rank, type(msg).__name__)

    def advance(self) -> None:
        """One pass of the cohorts; ``busy`` while the executor may move without a new message (a pass that moved
        but left nothing to do waits in the next poll: a split loop's rank that sent its step waits for the other's)."""
        ex = self.executor
        ex.advance()
        self.busy = bool(ex.dirty)

    def send(self) -> None:
        """Frames for other ranks leave first, then the conductor's: another rank's next step waits on its
        frame, while the conductor's client rows only go on to the client (a send can cost the sender its
        core for a while on a loaded machine, as the receiving side's threads wake)."""
        if self.executor.out or self.timing:
            conductor = self._pack()
            self.outbox.flush()
            timings = self.timing.take() if self.timing is not None else None
            if timings is not None:  # before the walk ends and finishes they precede
                conductor.insert(0, timings)
            for msg in conductor:
                self.outbox.put(CONDUCTOR, pack(msg, self.codec, True))
        self.outbox.flush()

    def _hand_off(self) -> None:
        """Mid-pass: the rows for other ranks leave now (``Effects.hand_off_now``); the conductor's wait for ``send``."""
        self._pack(self.executor.out.take_ranks())
        self.outbox.flush()

    def _pack(self, messages: list | None = None) -> list:
        """Packs the messages for other ranks into the outbox (``messages``, else all the executor has); returns
        the conductor's, in order."""
        nodes, node, codec = self.nodes, self.site.node, self.codec
        conductor = []
        for dest, msg in self.executor.out.take() if messages is None else messages:
            if isinstance(msg, m.WorkerStats):
                self._site_stats(msg.stats)
            if dest == CONDUCTOR:
                conductor.append(msg)
                continue
            inline = nodes.get(dest[1]) != node  # another node, or not known yet: inside the frame
            shm, t0 = codec.shm_sent, time.perf_counter()
            packed = pack(msg, codec, inline)
            tensors, nbytes = _tensors(packed)
            if tensors:
                (self.inline_to if codec.shm_sent == shm else self.shm_to)[dest[1]] += tensors
            self.outbox.put(dest, packed)
            if self.timing is not None:
                self._record_transfer(dest[1], packed, t0, tensors, nbytes)
            sent = self.sent_to[dest[1]]
            sent[0], sent[1], sent[2] = sent[0] + 1, sent[1] + tensors, sent[2] + nbytes
            sent[3] += time.perf_counter() - t0
        return conductor

    def _record_transfer(self, dest: int, msg: m.Message, t0: float, tensors: int, nbytes: int) -> None:
        """A ``transfer`` record: packing and queueing one message for rank ``dest``, for the requests it carries."""
        rids = getattr(msg, "request_ids", None) or [getattr(msg, "request_id", "")]
        end = time.time_ns()
        start = end - int((time.perf_counter() - t0) * 1e9)
        attrs = {"message": type(msg).__name__, "tensors": tensors, "bytes": nbytes, "peer": dest}
        self.timing.add("transfer", f"rank {dest}", getattr(msg, "walk", ""), start, end, rids, attrs)

    def _site_stats(self, stats: m.RankStats) -> None:
        stats.shm_sent, stats.bad_frames = self.codec.shm_sent, self.inbox.bad_frames
        stats.shm_to, stats.inline_to = dict(self.shm_to), dict(self.inline_to)
        box = self.outbox
        stats.sent_to = {rank: {"messages": n, "tensors": t, "bytes": b, "seconds": s + box.send_s.get(("rank", rank), 0.0),
                                "frames": box.frames.get(("rank", rank), 0),
                                "direct_frames": box.direct_frames.get(("rank", rank), 0)}
                         for rank, (n, t, b, s) in self.sent_to.items()}
        stats.address, stats.node, stats.host = self.inbox.address, self.site.node, self.site.host
        stats.active_s = time.perf_counter() - self._born - self.idle_s

    def on_peers(self, msg: m.Peers) -> None:
        self.nodes = dict(msg.nodes)
        for rank, address in msg.addresses.items():
            if self.outbox.addresses.get(("rank", rank)) != address or rank == self.rank:
                self.outbox.connect(("rank", rank), address)
        for rank in msg.addresses:
            path = msg.direct.get(rank, "")
            if self.direct and path and rank != self.rank and self.nodes.get(rank) == self.site.node:
                self.outbox.link(("rank", rank), path, self.rank)
            else:
                self.outbox.unlink(("rank", rank))

    def _listen_direct(self) -> str:
        """A datagram socket beside an IPC inbox, for frames from workers of this node; its path ("" if none)."""
        if not self.site.inbox.startswith("ipc://") or sys.platform != "linux":
            return ""  # elsewhere (macOS: 2 KiB datagrams by default) every frame goes through ZeroMQ
        path = self.site.inbox.removeprefix("ipc://").removesuffix(".sock") + ".dgram"
        try:
            self.inbox.listen_direct(path)
        except OSError as e:
            log.warning("rank %d: no datagram socket at %s (%s): ZeroMQ for every frame", self.rank, path, e)
            return ""
        return path

    # ---- housekeeping ------------------------------------------------------------------------
    def housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._last_stats >= STATS_INTERVAL_S:
            self._last_stats = now
            self.executor.on_stats_query(m.StatsQuery())
            self.send()
        if now - self._last_sweep >= SWEEP_S:
            self._last_sweep = now
            self.executor.sweep()

    def _stats_soon(self) -> None:
        """Report soon after a release, so observers see the state freed without a whole stats period."""
        self._last_stats = min(self._last_stats, time.monotonic() - STATS_INTERVAL_S + 0.05)


def _tensors(msg: m.Message) -> tuple[int, int]:
    """(tensors, their bytes) a packed message carries (a stacked step counts once)."""
    stacked = getattr(msg, "stacked", None)
    if stacked is not None:
        return 1, stacked.nbytes
    tensors = [v for v in getattr(msg, "values", None) or () if isinstance(v, m.TensorMsg)]
    return len(tensors), sum(t.nbytes for t in tensors)
