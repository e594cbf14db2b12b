"""What a rank reports about itself (RankStats) and the conductor's view of the run (RuntimeSnapshot).

They travel inside WorkerStats and Status (walkserve/protocol/messages.py) and feed /metrics,
the dashboard and stream admission.
"""

from __future__ import annotations

from typing import Any

import msgspec

# Upper edges (seconds) of the slack-at-dispatch buckets of ``RankStats.slack``; one more bucket holds the rest.
SLACK_EDGES_S = (-1.0, -0.5, -0.25, -0.1, 0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


class RankStats(msgspec.Struct, kw_only=True):
    """One rank's gauges and counters (checked on decode like every message).

    Streams (docs/runtime.md, "Streams under load"): ``stream_scheduling`` is the
    rank's mode (deadline or fifo); ``streams`` the requests whose playback clock
    runs here; ``step_costs`` node -> batch bucket (1, 2, 4 ...) -> measured seconds of
    one step (a moving mean); ``slack`` node -> members dispatched per slack bucket
    (``SLACK_EDGES_S``, counts, len(edges) + 1); ``scheduling`` counters
    (``held_paced``, ``held_capacity``: member-steps that waited; ``gaps``: chunks
    the emitting node completed after the client's audio ran out) and ``gap_s``
    (their total lateness).
    """

    walk_states: int = 0
    requests: int = 0
    engine_state: int = 0  # requests holding state in an engine (KV contexts, caches)
    inflight: int = 0
    cohort_members: int = 0
    early: int = 0
    counters: dict[str, int] = {}
    engines: dict[str, dict[str, float]] = {}  # component -> Engine.stats()
    nodes: dict[str, dict[str, float]] = {}
    busy_s: dict[str, float] = {}
    steps: dict[str, int] = {}
    shm_sent: int = 0
    shm_to: dict[int, int] = {}  # tensors sent through shared memory, per destination rank
    inline_to: dict[int, int] = {}  # tensors sent inside frames, per destination rank
    # per destination rank: messages, tensors, bytes (tensor payload), seconds (packing, encoding, sending), frames
    # and direct_frames (those sent over the node's datagram socket, not ZeroMQ)
    sent_to: dict[int, dict[str, float]] = {}
    address: str = ""  # the inbox it bound
    node: str = ""  # its RankSite's node and host
    host: str = ""
    bad_frames: int = 0
    stream_scheduling: str = ""
    streams: int = 0
    step_costs: dict[str, dict[int, float]] = {}
    step_counts: dict[str, dict[int, list[float]]] = {}  # node -> bucket -> cumulative [steps, members, busy s]
    active_s: float = 0.0  # the loop's seconds not waiting for a message (both: admission's capacity model)
    slack: dict[str, list[int]] = {}
    scheduling: dict[str, int] = {}
    gap_s: float = 0.0


class RuntimeSnapshot(msgspec.Struct, kw_only=True):
    """The conductor's view of the run (filled by C, carried in Status): its queue, counters and every rank's report."""

    running: int = 0
    waiting: int = 0
    counters: dict[str, int] = {}
    workers: dict[int, RankStats] = {}  # rank -> its latest WorkerStats
    restarts: dict[int, int] = {}
    pids: dict[int, int] = {}
    zygote_pid: int | None = None
    hosts: dict[int, str] = {}  # rank -> its node's IP (from Ready)
    nodes: dict[int, str] = {}  # rank -> its node (from Ready)
    launcher: str = "local"
    ray: dict[str, Any] = {}  # RaySupervisor.describe() for a ``launcher: ray`` run
    # real-time streams (StreamDesk.snapshot): running, waiting, capacity (admitted at once now),
    # capacity_measured (1 once step costs are known, else the warm-up bound), load (busiest rank's share)
    streams: dict[str, float] = {}
