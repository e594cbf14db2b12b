"""Every message that crosses a process boundary, in one place (the rank reports they carry: rank_stats.py).

Who fills what: the frontend (F) sends Submit/Abort/Shutdown to the
conductor (C); C sends StartWalk/MoveContexts/Release/Stop to workers (W);
workers send each other Values/StreamItems/StreamEnds/LoopEvents/Flows and,
between walks, a request's moved KV contexts (Contexts); workers report
ClientOuts/WalkOut/NodeDone/WalkStarted/Failed/RankFailed/Ready/WorkerStats to C; C
reports Events/Finished/Rejected/Status to F. With timing records on (RuntimeConfig.timings),
workers send C their Timings, which C passes on to F with its own, in order (a request's
records arrive before its Finished). Messages that carry rows carry
one per request of a step: a step's outputs of one node output are one
ClientOuts (C passes them on as one Events), its values for one other rank
one Values, and so on; row i of a stacked tensor belongs to the i-th
request. Tensors travel as TensorMsg: inline bytes for small ones, a
shared-memory segment name for large ones on one host. Messages to one
destination are sent together in a Batch (one frame).
"""

from __future__ import annotations

import msgspec

from walkserve.core.params import AnyParams
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.protocol.rank_stats import RankStats, RuntimeSnapshot

Path = tuple[int, ...]


class TensorMsg(msgspec.Struct, frozen=True, tag="t"):
    """A tensor on the wire: ``data`` inline, or ``shm`` names a segment the receiver maps and unlinks."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | None = None
    shm: str | None = None
    nbytes: int = 0


# A value crossing between processes: a tensor, or a small msgpack-native value.
Wire = TensorMsg | int | float | str | bool | list | None


# ---- frontend -> conductor -----------------------------------------------------------------


class Submit(msgspec.Struct, tag=True, array_like=True):
    request: RequestSpec


class Abort(msgspec.Struct, tag=True, array_like=True):
    """End a request now. ``reason`` "stop": the frontend found a stop string, so it finished (not aborted)."""

    request_id: str
    reason: str = "abort"


class Shutdown(msgspec.Struct, tag=True, array_like=True):
    drain_s: float = 0.0


class StatusQuery(msgspec.Struct, tag=True, array_like=True):
    query_id: int = 0


# ---- conductor -> frontend -----------------------------------------------------------------


class Events(msgspec.Struct, tag=True, array_like=True):
    """One node output's events for several requests (a cohort step); see ClientOuts for ``stacked``/``values``."""

    walk: str
    node: str
    modality: str
    output: str
    request_ids: list[str]
    paths: list[Path]
    indices: list[int]
    stacked: TensorMsg | None = None
    values: list[Wire] = []


class Finished(msgspec.Struct, tag=True, array_like=True):
    request_id: str
    reason: str
    error: str | None = None
    usage: dict[str, int] = {}
    timings: dict[str, float] = {}


class Rejected(msgspec.Struct, tag=True, array_like=True):
    request_id: str
    message: str
    retry_after_s: float = 1.0
    invalid: bool = False  # True: the request itself is malformed (a 400), not the server full (a 429)
    cause: str = "queue_full"  # why a 429: queue_full, or capacity (a real-time stream that would not stay real-time)


class Status(msgspec.Struct, tag=True, array_like=True):
    state: str  # starting | ready | degraded | draining | stopped
    detail: str
    workers: dict[int, bool]
    stats: RuntimeSnapshot
    query_id: int = 0  # the StatusQuery this answers (0 for periodic updates)


# ---- conductor -> worker -------------------------------------------------------------------


class StartWalk(msgspec.Struct, tag=True, array_like=True):
    """Start ``walk`` for a request on every rank that hosts one of its nodes.

    ``ranks`` maps each node of the walk to the rank that runs it for this
    request; ``inputs`` holds the walk inputs this rank's nodes read;
    ``params`` is the request's typed model params (its family's ``Params``),
    ``sampling`` the request's sampling, ``node_sampling`` a node's own.
    When every node of the walk is on the receiving rank, ``spec`` is the
    request and ``sticky`` the ranks its components were given, so the worker
    can start the next walk itself if the state machine's choice is all local
    too (WalkStarted). ``stream``: the request's audio plays as it streams, so
    its walks count as streamed from the first (prefill is part of its time to
    first audio) on every rank (docs/runtime.md, "Streams under load").
    """

    request_id: str
    walk: str
    ranks: dict[str, int]
    inputs: dict[str, Wire]
    params: AnyParams
    sampling: SamplingParams
    node_sampling: dict[str, SamplingParams] = {}
    spec: RequestSpec | None = None
    sticky: dict[str, int] = {}
    moved_in: list[int] = []  # ranks whose KV contexts (Contexts) must arrive before the walk starts
    stream: bool = False  # the request streams audio as it plays: ranks schedule it by playback deadlines


class MoveContexts(msgspec.Struct, tag=True, array_like=True):
    """Conductor -> worker: the request's next walk uses these KV contexts on ``to_rank``; send them there.

    ``contexts``: component -> the names of its contexts that move (a fanned
    context's members with it). The walk before has ended here, so the state is
    idle; the receiving rank holds the walk's start until it arrived
    (StartWalk.moved_in names the ranks it waits for).
    """

    request_id: str
    contexts: dict[str, list[str]]
    to_rank: int


class Release(msgspec.Struct, tag=True, array_like=True):
    """The request ended: drop every piece of its state."""

    request_id: str


class Stop(msgspec.Struct, tag=True, array_like=True):
    pass


class StatsQuery(msgspec.Struct, tag=True, array_like=True):
    pass


# ---- worker <-> worker: one message per step and destination, one row per request ----------
# Row i of each list belongs to request ``request_ids[i]``. Tensor values travel as ``stacked`` (rows
# of one tensor, when they share dtype and shape) or one by one in ``values``.


class Values(msgspec.Struct, tag=True, array_like=True):
    """One node output's values for consumers on the receiving rank.

    ``paths[i]`` is where request i's value sits: the producer's path, or, for
    a value leaving loops, the path of the level it lands in.
    """

    walk: str
    node: str
    output: str
    request_ids: list[str]
    paths: list[Path]
    stacked: TensorMsg | None = None
    values: list[Wire] = []


class StreamItems(msgspec.Struct, tag=True, array_like=True):
    """Items of one stream: request i's item number ``indices[i]`` of its instance ``prefixes[i]``."""

    walk: str
    stream: int
    request_ids: list[str]
    prefixes: list[Path]
    indices: list[int]
    stacked: TensorMsg | None = None
    values: list[Wire] = []


class StreamEnds(msgspec.Struct, tag=True, array_like=True):
    """Producers of one stream finished: request i's instance ``prefixes[i]`` has ``counts[i]`` items."""

    walk: str
    stream: int
    request_ids: list[str]
    prefixes: list[Path]
    counts: list[int]


class LoopEvents(msgspec.Struct, tag=True, array_like=True):
    """Decisions of one level (a loop, or a stream scope) made on the rank that can make them.

    Request i's instance ``outers[i]``: iteration ``ks[i]`` continues
    (``ends[i]`` < 0), or the instance ended with ``ends[i]`` iterations exposed.
    """

    walk: str
    scope: str
    request_ids: list[str]
    outers: list[Path]
    ks: list[int]
    ends: list[int]


class Flows(msgspec.Struct, tag=True, array_like=True):
    """Backpressure on one stream: pause (or resume) request i's producer instance ``prefixes[i]``."""

    walk: str
    stream: int
    request_ids: list[str]
    prefixes: list[Path]
    pauses: list[bool]


class SegmentState(msgspec.Struct, array_like=True):
    """Rows ``[start, start + n)`` of a context appended together (engines.kv.sequence.Segment, moving)."""

    start: int
    n: int
    mask: str
    frame: int
    pos_base: int | float | None
    positions: Wire
    embeds: Wire
    embed_rows: Wire
    token_inputs: dict[str, Wire]
    axes: int
    component: str = ""  # the component of a KV share group that wrote the rows ("": the context's own)


class ContextState(msgspec.Struct, array_like=True):
    """One KV context of a request on its way to another rank: its history, and the K/V of computed rows.

    ``k``, ``v``: [layers, computed rows, KV heads, head dim], or None (the
    receiver recomputes the rows from ``segments``).
    """

    name: str
    component: str
    token_ids: list[int]
    sampled: list[int]
    segments: list[SegmentState]
    cache_limit: int | None
    next_position: int | float
    axes: int
    k: Wire = None
    v: Wire = None


class Contexts(msgspec.Struct, tag=True, array_like=True):
    """Worker -> worker: a request's KV contexts, moved here from ``from_rank`` (each names its component)."""

    request_id: str
    from_rank: int
    contexts: list[ContextState]


# ---- worker -> conductor -------------------------------------------------------------------


class ClientOuts(msgspec.Struct, tag=True, array_like=True):
    """One node output's client values for several requests at once (a cohort step).

    Either ``stacked`` holds them as rows of one tensor (row i is request i's
    value; same dtype and shape for all), or ``values`` lists them one by one.
    """

    walk: str
    node: str
    modality: str
    output: str
    request_ids: list[str]
    paths: list[Path]
    stacked: TensorMsg | None = None
    values: list[Wire] = []


class WalkOut(msgspec.Struct, tag=True, array_like=True):
    request_id: str
    walk: str
    name: str
    value: Wire


class NodeDone(msgspec.Struct, tag=True, array_like=True):
    """Every node of the walk on the sending rank (``nodes``) finished, after ``firings`` firings."""

    request_id: str
    walk: str
    nodes: list[str]
    firings: int
    hit_bound: bool = False


class WalkStarted(msgspec.Struct, tag=True, array_like=True):
    """A worker finished ``finished`` (every node of it was there) and started ``walk`` itself.

    The model's state machine picked ``walk`` and every node of it runs on
    this rank (``ranks``), so the walk began without a round trip; the
    conductor records it as if it had sent the StartWalk.
    """

    request_id: str
    finished: str
    firings: int
    hit_bound: bool
    walk: str
    ranks: dict[str, int]


class Failed(msgspec.Struct, tag=True, array_like=True):
    request_id: str
    error: str


class Ready(msgspec.Struct, tag=True, array_like=True):
    """A worker built its components and listens on ``address``; ``node``/``host``: its RankSite's; ``direct``:
    the path of its datagram socket for workers of its node ("" for none; ``walkserve.transport.direct``)."""

    rank: int
    pid: int
    address: str
    detail: str = ""
    node: str = ""
    host: str = ""
    direct: str = ""


class Timing(msgspec.Struct, array_like=True):
    """One timed piece of work, for the requests it served (a batched firing serves several).

    ``kind``: ``node`` (a firing of node ``name``; one engine call), ``transfer`` (packing and sending
    one message to ``name``, e.g. ``rank 1``), ``walk`` (the conductor's view of a walk, from its start
    to the next walk or the end), ``admission`` (Submit received to the first walk sent) or ``queue``
    (the wait in the admission queue). Times are wall-clock ``time.time_ns()`` of the recording process.
    """

    kind: str
    name: str
    walk: str
    start_ns: int
    end_ns: int
    request_ids: list[str]
    attrs: dict[str, int | float | str] = {}


class Timings(msgspec.Struct, tag=True, array_like=True):
    """W -> C -> F: timing records of one process (``rank`` -1: the conductor), sent with the frame they precede."""

    rank: int
    pid: int
    records: list[Timing]


class RankFailed(msgspec.Struct, tag=True, array_like=True):
    """A worker could not start its rank (W -> C); the run fails with ``reason``."""

    rank: int
    reason: str


class WorkerStats(msgspec.Struct, tag=True, array_like=True):
    rank: int
    stats: RankStats


class Peers(msgspec.Struct, tag=True, array_like=True):
    """Conductor -> workers: every rank's inbox address and node (sent after start and after a restart).

    Ranks on the same node pass big tensors through shared memory; to a rank
    on another node (or of unknown node) tensors travel inside the frames.
    ``direct``: the ranks that take frames from workers of their node on a
    datagram socket, and its path.
    """

    addresses: dict[int, str]
    nodes: dict[int, str] = {}
    direct: dict[int, str] = {}


Message = (
    Submit
    | Abort
    | Shutdown
    | StatusQuery
    | Events
    | Finished
    | Rejected
    | Status
    | StartWalk
    | Release
    | Stop
    | StatsQuery
    | MoveContexts
    | Contexts
    | Values
    | StreamItems
    | StreamEnds
    | LoopEvents
    | Flows
    | WalkStarted
    | ClientOuts
    | WalkOut
    | NodeDone
    | Failed
    | RankFailed
    | Ready
    | WorkerStats
    | Peers
    | Timings
)


class Batch(msgspec.Struct, array_like=True):
    """Every message for one destination from one loop turn, plus the run token."""

    token: str
    messages: list[Message]

