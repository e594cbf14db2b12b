"""The worker -> engine boundary: Firing in, FiringResult out.

A Firing is one node instance whose input slots are all filled: the worker
fills every field, the engine reads them. An engine owns the queue of the
firings submitted to it and decides how to batch them; the worker calls it
from a single thread only, so engines need no locks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from walkserve.core.sampling import SamplingParams
from walkserve.streaming.policy import Span


@dataclass(slots=True)
class Firing:
    """One node instance to run. Filled by the worker; read-only for the engine.

    ``inputs`` maps each input slot to a tensor. A slot fed by a streaming
    edge holds the chunk's items concatenated along dim 0 (possibly empty),
    and ``spans[slot]`` says which part of the stream it is (index, start,
    leading context items, whether it is the flushed final chunk). ``path``
    holds the iteration index of each enclosing loop (outermost first; the
    chunk index for a per-chunk consumer). ``outputs`` are the output names
    the graph reads; the engine must return exactly those. ``sampling`` is
    this node's sampling for the request (``RequestSpec.node_sampling[node]``,
    else the request's). ``kv``: for a KV-cache component, the node's declared
    context operations bound to ``inputs`` (``walkserve.engines.kv.ops``),
    filled by the worker's cohort pass once every input is resolved; None
    lets the engine bind them itself.
    """

    id: int
    request_id: str
    walk: str
    node: str
    component: str
    op: str
    path: tuple[int, ...]
    inputs: dict[str, Any]
    outputs: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    sampling: SamplingParams | None = None
    node_params: Mapping[str, Any] = field(default_factory=dict)
    spans: dict[str, Span] = field(default_factory=dict)
    kv: tuple[Any, ...] | None = None  # tuple[walkserve.engines.kv.ops.ContextOp, ...]

    @property
    def iteration(self) -> int:
        """The innermost iteration index (0 outside any loop)."""
        return self.path[-1] if self.path else 0


@dataclass(slots=True)
class Group:
    """One node's firings for several requests, run as one call (a loop cohort's step; see ``Engine.run_group``).

    Member ``i`` is request ``request_ids[i]`` at ``paths[i]`` with ``inputs[i]``
    (and ``spans[i]`` when the node reads a stream), ``sampling[i]`` (this node's)
    and, for a KV-cache component, ``kv[i]`` (its bound context operations;
    ``kv`` None: the engine binds them); the other fields are those of a Firing,
    shared by every member.
    """

    walk: str
    node: str
    component: str
    op: str
    outputs: tuple[str, ...]
    node_params: Mapping[str, Any]
    request_ids: list[str]
    paths: list[tuple[int, ...]]
    inputs: list[dict[str, Any]]
    params: list[Mapping[str, Any]]
    sampling: list[SamplingParams | None]
    kv: list[tuple[Any, ...] | None] | None = None
    spans: list[dict[str, Span]] | None = None


@dataclass(slots=True)
class FiringResult:
    """The outcome of one firing: its outputs (tensors by name) or an error message for its request."""

    firing: Firing
    outputs: dict[str, Any] | None = None
    error: str | None = None


class Engine(ABC):
    """Runs the firings of one component on one device.

    Contract, in the order the worker calls things:
      - ``submit(firing)`` queues a firing; it never blocks and never raises
        for a bad request (a bad request becomes a FiringResult with ``error``).
      - ``step()`` runs at most one batch (or one scheduling round) and returns
        the results that completed in it, possibly none (a chunked prefill in
        progress), possibly of firings submitted in earlier calls.
      - ``has_work()`` is true while a submitted firing has no result yet.
      - ``release(request_id)`` is called once the request has ended (finished,
        failed or aborted): drop its queued firings without results and free
        its state (KV blocks, caches). Idempotent.
    Every firing submitted gets exactly one result unless its request is released first.
    """

    component: str

    @abstractmethod
    def submit(self, firing: Firing) -> None: ...

    @abstractmethod
    def step(self) -> list[FiringResult]: ...

    @abstractmethod
    def has_work(self) -> bool: ...

    @abstractmethod
    def release(self, request_id: str) -> None: ...

    def run_group(self, group: Group) -> list[dict[str, Any] | str]:
        """Run every member of ``group`` now: per member, its outputs or an error message.

        Optional. An engine that overrides it (``runs_groups = True``) saves the
        per-firing bookkeeping of a loop cohort's steps; the worker submits the
        members of other engines as ordinary firings and steps them as usual.
        """
        raise NotImplementedError

    def run_groups(self, groups: list[Group]) -> list[list[dict[str, Any] | str]]:
        """Several nodes' groups of one cohort step (nodes independent of each other), per group its results.

        The default runs them one after the other; an engine that can batch
        them together (the KV engine: one forward for the CFG passes of every
        member) overrides it.
        """
        return [self.run_group(g) for g in groups]

    def export_contexts(self, request_id: str, names: list[str]) -> list[Any]:
        """The request's contexts ``names`` (``protocol.messages.ContextState`` each), removed from here.

        Optional (``migrates = True``). Called between walks, when nothing of the
        request runs here, to move its state to the rank that runs its next walk;
        that rank's engine gets it through ``import_contexts`` before any firing.
        """
        raise NotImplementedError

    def import_contexts(self, request_id: str, contexts: list[Any]) -> None:
        """Take over state another rank's engine exported for the request (see ``export_contexts``)."""
        raise NotImplementedError

    migrates = False
    runs_groups = False
    kv_contexts = False  # True: the worker binds each firing's declared context operations (Firing.kv, Group.kv)

    def stats(self) -> dict[str, float]:
        """Gauges and counters for /metrics (e.g. kv_blocks_used, kv_blocks_total, preemptions)."""
        return {}

    def state_count(self) -> int:
        """How many requests hold state in this engine (tests count it back to zero)."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free device memory; called once when the worker shuts down, after the engine's last step."""
