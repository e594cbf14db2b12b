"""Runtime configuration: frozen, validated at construction."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from walkserve.core import env
from walkserve.core.errors import ConfigError
from walkserve.core.scheduling import StreamScheduling


@dataclass(frozen=True)
class RuntimeConfig:
    """How the runtime behaves, whatever the model.

    ``max_running`` requests run at once; ``max_waiting`` more wait in a
    queue; past that, submissions are rejected (HTTP 429). ``cohorts``
    steps every request's instance of a loop (of any level) together in the
    worker's executor: one engine call per node per step for all of them
    (docs/runtime.md); off, each request's instances step on their own, by
    the same code (a debugging and testing aid).
    ``engine_options`` override per-engine-kind options, e.g.
    ``{"kv": {"num_blocks": 64}, "stateless": {"max_batch": 16}}``.
    ``ray_address`` is the running Ray cluster a placement with ``launcher:
    ray`` joins (``auto``: the one this machine is a node of; ``HOST:PORT``);
    None reads ``$RAY_ADDRESS``, else ``auto``. ``placement_timeout_s`` bounds the wait
    for Ray to reserve every rank's resources (and to place a restarted rank).
    ``stream_scheduling`` says how each rank orders ready work by playback
    deadlines (``walkserve serve --stream-scheduling {deadline,fifo}``).
    ``timelines``: how many recent requests keep their timeline in the frontend
    (``GET /v1/requests/{id}/timeline``); ``trace_dir``: a directory that gets one
    Chrome/Perfetto trace file per request. ``timings``: the conductor and workers record
    per-firing timing records (docs/operability.md); ``AsyncEngine.start`` turns it on when
    timelines, a trace directory or OpenTelemetry (``OTEL_*``) want them.
    ``split_steps``: a cohort's step whose outputs another rank reads goes in
    two halves once it holds at least this many members, so the other rank
    can work on the first half while this one runs the second (0, the
    default: never split; on a loaded 2-core machine the halves' extra
    messages cost more than the overlap gives: docs/performance.md).
    ``direct_peers``: workers of one node send each other their frames over
    Unix datagram sockets rather than ZeroMQ (one wake-up per hop instead of
    three; docs/runtime.md; Linux only); off: ZeroMQ for every frame.
    ``worker_spin``: how many iterations a worker's OpenMP threads busy-wait
    after a parallel region before they sleep (``GOMP_SPINCOUNT`` in the
    workers' environment, unless it or ``OMP_WAIT_POLICY`` is set there
    already; -1: libgomp's own default). libgomp spins 300,000 iterations
    (~6 ms) while a process's OpenMP threads do not outnumber its cores and
    100 once they do, so a worker got one or the other by accident (whether
    its main thread ran a parallel op while loading); with the long spin a
    2-thread decode step on a loaded 2-core machine took ~4x the wall time
    and CPU (docs/performance.md, served vs bare at 2 threads).

    ``worker_environ`` is what a worker process gets on top of the
    launcher's environment.
    """

    max_running: int = 256
    max_waiting: int = 1024
    cohorts: bool = True
    start_timeout_s: float = field(default_factory=env.WALKSERVE_START_TIMEOUT_S.get)
    worker_threads: int = field(default_factory=env.WALKSERVE_WORKER_THREADS.get)  # 0 = cores / workers
    worker_spin: int = field(default_factory=env.WALKSERVE_WORKER_SPIN.get)  # -1 = OpenMP's own default
    status_interval_s: float = 0.25
    restart_workers: bool = True
    dtype: str | None = None  # override the model's dtype on every rank ("float32", "bfloat16", "float16")
    engine_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    ray_address: str | None = None
    placement_timeout_s: float = field(default_factory=env.WALKSERVE_PLACEMENT_TIMEOUT_S.get)
    stream_scheduling: StreamScheduling = field(default_factory=StreamScheduling)
    timelines: int = 0
    trace_dir: str | None = None
    timings: bool = False
    # Real-time streams (RequestSpec.realtime; docs/streaming-capacity.md): "capacity" admits them while the
    # measured step costs keep every stream ahead of playback, "count" by max_running like any request.
    admission: str = "capacity"
    stream_headroom: float = 0.8  # the share of the busiest rank's time streams may take
    stream_ttfa_budget_s: float = 1.0  # a stream that cannot start within this waits no longer: 429 at once
    max_streams: int = 0  # a bound on admitted streams beside the estimate (0: none)
    stream_warmup: int = 4  # streams admitted at once before any step cost is measured
    split_steps: int = 0
    direct_peers: bool = True

    def __post_init__(self) -> None:
        if self.max_running < 1:
            raise ConfigError(f"max_running must be >= 1, got {self.max_running}")
        if self.max_waiting < 0:
            raise ConfigError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.start_timeout_s <= 0:
            raise ConfigError("start_timeout_s must be > 0")
        if self.worker_spin < -1:
            raise ConfigError(f"worker_spin must be >= -1 (-1: OpenMP's default), got {self.worker_spin}")
        if self.split_steps < 0:
            raise ConfigError(f"split_steps must be >= 0, got {self.split_steps}")
        if self.placement_timeout_s <= 0:
            raise ConfigError("placement_timeout_s must be > 0")
        if self.timelines < 0:
            raise ConfigError(f"timelines must be >= 0, got {self.timelines}")
        self._check_streams()

    def worker_environ(self, base: Mapping[str, str] = os.environ) -> dict[str, str]:
        if self.worker_spin < 0 or "GOMP_SPINCOUNT" in base or "OMP_WAIT_POLICY" in base:
            return {}  # the user's own OpenMP setting wins
        return {"GOMP_SPINCOUNT": str(self.worker_spin)}

    def _check_streams(self) -> None:
        if self.admission not in ("capacity", "count"):
            raise ConfigError(f"admission must be capacity or count, got {self.admission!r}")
        if not 0 < self.stream_headroom <= 1:
            raise ConfigError(f"stream_headroom must be in (0, 1], got {self.stream_headroom}")
        if self.stream_ttfa_budget_s < 0:
            raise ConfigError(f"stream_ttfa_budget_s must be >= 0, got {self.stream_ttfa_budget_s}")
        if self.max_streams < 0 or self.stream_warmup < 1:
            raise ConfigError(f"max_streams must be >= 0 and stream_warmup >= 1, got {self.max_streams}, {self.stream_warmup}")
