"""The component contract: how a model describes a component to an engine, and what a stateless one is called with.

A leaf below both models and engines (it imports only core and streaming):
a model family returns ``ComponentSpec``s, the engine registry builds them
with a ``BuildContext``, and the stateless engine calls the built object as

    forward_batch(batch: Batch) -> list[dict[str, Any]]     # one outputs dict per item, in order

Each outputs dict holds exactly the names in that item's ``outputs``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from walkserve.core.params import Params
from walkserve.core.sampling import SamplingParams
from walkserve.streaming.policy import Span


@dataclass(frozen=True)
class BuildContext:
    """Where a component is being built: the rank, its device (``cpu``, ``cuda:0``) and dtype name."""

    rank: int
    device: str
    dtype: str = "float32"
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ComponentSpec:
    """One component of a model.

    ``engine`` selects the engine kind that runs it ("kv", "stateless",
    "null"). ``build(ctx)`` runs in the worker and returns what that engine
    kind expects (for "kv" a paged-attention model, for "stateless" an object
    with ``forward_batch(Batch)``). ``weight_bytes`` and ``state_bytes`` feed the
    placement's memory check; ``state_bytes`` is a size, or a function of the
    device and its free bytes once weights are loaded (None on a CPU) for
    state sized from the device, such as a KV pool (``placement.memory``).
    ``stateful`` components keep per-request state between firings (a KV
    cache) and so cannot be split across ranks within one request.
    Components of one ``kv_share`` name (e.g. pi0's VLM and action expert)
    share one KV engine and pool on a rank, so one can query contexts another
    wrote: their KV geometry (layers, KV heads, head dim) must match, and a
    placement must put them on the same ranks.
    """

    name: str
    engine: str
    build: Callable[[BuildContext], Any]
    weight_bytes: int = 0
    state_bytes: int | Callable[[str, int | None], int] = 0
    stateful: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    kv_share: str = ""


@dataclass(frozen=True, slots=True)
class Item:
    """One request's firing of the batch's node: filled by the engine, read by the component.

    ``inputs`` maps each input slot to a tensor; a slot fed by a streaming edge
    holds the chunk's items concatenated along dim 0, and ``spans[slot]`` says
    which part of the stream it is. ``path`` holds the iteration index of each
    enclosing loop (outermost first). ``outputs`` are the names the graph reads
    (empty outside the engine: a direct caller takes what the component gives).
    ``sampling`` is this node's sampling for the request. ``walk``, ``outputs``
    and ``node_params`` are per item because one node name may appear in
    several walks.
    """

    inputs: Mapping[str, Any]
    request_id: str = ""
    walk: str = ""
    path: tuple[int, ...] = ()
    outputs: tuple[str, ...] = ()
    params: Params = field(default_factory=Params)  # the request's typed model params (its family's struct)
    sampling: SamplingParams | None = None
    node_params: Mapping[str, Any] = field(default_factory=dict)
    spans: Mapping[str, Span] = field(default_factory=dict)

    @property
    def iteration(self) -> int:
        """The innermost iteration index (0 outside any loop)."""
        return self.path[-1] if self.path else 0


@dataclass(frozen=True, slots=True)
class Batch:
    """The items a stateless component runs in one call: every item is of node ``node`` and op ``op``."""

    node: str
    op: str
    items: tuple[Item, ...]

    @classmethod
    def of(cls, inputs: Iterable[Mapping[str, Any]], node: str = "", op: str = "forward") -> Batch:
        """A batch of bare inputs (direct callers: offline pipelines, tests)."""
        return cls(node, op, tuple(Item(i) for i in inputs))

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)
