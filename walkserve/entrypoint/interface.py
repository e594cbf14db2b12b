"""EngineClient: what the HTTP server (and any embedding program) needs from a running model."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from walkserve.core.finish import FinishReason
from walkserve.core.outputs import OutputEvent, RequestFinished
from walkserve.core.request import RequestSpec
from walkserve.entrypoint.timeline import TimelineStore
from walkserve.models.processor import ModelCard, Processor


@dataclass(frozen=True)
class Health:
    """``ok`` only when every worker is alive and the runtime is accepting requests."""

    ok: bool
    state: str  # "starting" | "ready" | "degraded" | "draining" | "stopped"
    detail: str = ""
    workers: dict[int, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class RuntimeStats:
    """A snapshot for /metrics. Counters only grow; gauges are current values."""

    running: int = 0
    waiting: int = 0
    finished: int = 0
    failed: int = 0
    aborted: int = 0
    rejected: int = 0
    preemptions: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    # per node: {"batches": n, "items": n, "busy_s": s} (mean batch size = items / batches)
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)
    # per engine/component extra gauges
    engines: dict[str, dict[str, float]] = field(default_factory=dict)
    requests_with_state: int = 0
    # per (node, rank): {"batches", "items", "busy_s"}; per (component, rank): the engine's stats;
    # per rank: its gauges ("inflight" firings, "requests", ...); per (rank, peer): what it sent that peer
    # ({"messages", "tensors", "bytes", "seconds"}). Ranks and nodes are few: the labels stay bounded.
    node_ranks: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    engine_ranks: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    rank_gauges: dict[int, dict[str, float]] = field(default_factory=dict)
    transfers: dict[tuple[int, int], dict[str, float]] = field(default_factory=dict)
    # real-time streams in the runtime: running, waiting, capacity, capacity_measured, load, and the counters
    # admitted / rejected_capacity (docs/streaming-capacity.md)
    streams: dict[str, float] = field(default_factory=dict)
    # per (node, rank): members dispatched per slack bucket (RankStats.slack, edges SLACK_EDGES_S); per rank: its
    # deadline scheduler's counters (held_paced, held_capacity, gaps) and gap_s
    slack: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    rank_streams: dict[int, dict[str, float]] = field(default_factory=dict)


class EngineClient(ABC):
    """A running model.

    ``generate`` admits a request and yields its OutputEvents in production
    order, then exactly one RequestFinished; it raises AdmissionRejected when
    the running set and the waiting queue are full. Breaking out of the
    iteration (or cancelling the task) aborts the request and frees its state.
    ``timeline``, when not None, keeps each recent request's timing records
    (docs/operability.md); the HTTP server then gives each request an id and a trace.
    """

    timeline: TimelineStore | None = None

    @property
    @abstractmethod
    def processor(self) -> Processor: ...

    @property
    def card(self) -> ModelCard:
        return self.processor.card()

    @abstractmethod
    def generate(self, request: RequestSpec) -> AsyncIterator[OutputEvent | RequestFinished]: ...

    @abstractmethod
    async def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> None:
        """End a running request. ``FinishReason.STOP``: the caller ended it at a stop condition it
        checks itself (a stop string), so it counts as finished, not aborted."""

    @abstractmethod
    def health(self) -> Health: ...

    @abstractmethod
    def stats(self) -> RuntimeStats: ...

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop accepting, let running requests finish (up to a grace period), stop every process."""
