"""The worker -> engine boundary: Groups in, results out (``Engine.run_groups``).

A Group is one node's step for several requests, every input filled: the
worker fills every field, the engine reads them. The worker calls an engine
from its one thread only, so engines need no locks. A Firing is one node
instance (one member of a group): the stateless engine's unit before it
builds its component's ``Batch`` (``engines.spec``), and the KV engine's own
unit of work.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from walkserve.core.params import Params
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
    params: Params = field(default_factory=Params)  # the request's typed model params (its family's struct)
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
    """One node's firings for several requests, run as one call (a cohort's step; see ``Engine.run_groups``).

    Member ``i`` is request ``request_ids[i]`` at ``paths[i]`` with ``inputs[i]``
    (and ``spans[i]`` when the node reads a stream), ``sampling[i]`` (this node's)
    and, for a KV-cache component, ``kv[i]`` (its bound context operations;
    ``kv`` None: the engine binds them; ``kv[i]`` None for a member offered again
    after ``LATER``: the engine goes on with the firing it bound); the other fields are those of a Firing,
    shared by every member. Members come in the rank's order (its deadline
    scheduler's: least playback slack first): an engine that cannot run them
    all in one step runs the first first.
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
    params: list[Params]
    sampling: list[SamplingParams | None]
    kv: list[tuple[Any, ...] | None] | None = None
    spans: list[dict[str, Span]] | None = None


@dataclass(slots=True)
class FiringResult:
    """The outcome of one firing: its outputs (tensors by name) or an error message for its request."""

    firing: Firing
    outputs: dict[str, Any] | None = None
    error: str | None = None

    def answer(self) -> dict[str, Any] | str:
        """As a member's result of ``Engine.run_groups``."""
        return self.outputs if self.error is None else self.error


class _Later:
    __slots__ = ()

    def __repr__(self) -> str:
        return "LATER"


LATER: Any = _Later()  # a member's result: not finished in this call, offered again in a later one
Result = dict[str, Any] | str  # a member's outputs, or an error message for its request (or LATER)


class Engine(ABC):
    """Runs the groups of one component on one device. One contract, in the order the worker calls things:

      - ``run_groups(groups)`` runs one step's groups (one node each, several
        requests; several groups when independent nodes of one component share
        the step, e.g. a CFG step's passes) and returns, per group, per member,
        its outputs dict (exactly the group's ``outputs``) or an error message
        for that request. It never raises for a bad request; an exception fails
        every member of the call.
      - With ``may_yield`` (a call of one group whose members wait for it), the
        engine may answer ``LATER`` for a member it started but did not finish
        (a long prefill split over passes, a fan wider than a step, so it does
        not hold the worker's whole pass). The worker offers that member again
        (same request, node and path; its ``Group.kv`` entry None, not bound
        again), in a later pass; the engine goes on with its work instead of
        starting it again, and answers when it is done.
      - ``gathers = True``: the worker collects this engine's groups over a
        whole pass (every cohort's) and calls it once after the pass, so it can
        batch members of different cohorts (a codec's windows of several
        streams); its members wait for that call.
      - ``release(request_id)`` is called once the request has ended (finished,
        failed or aborted): drop its work without results and free its state
        (KV blocks, caches). Idempotent.
    """

    component: str

    @abstractmethod
    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list[list[Result]]: ...

    @abstractmethod
    def release(self, request_id: str) -> None: ...

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
    gathers = False
    kv_contexts = False  # True: the worker binds each firing's declared context operations (Firing.kv, Group.kv)

    def step_capacity(self) -> int | None:
        """Members of one node one step takes at most (a KV engine's batch, a stateless node's ``max_batch``);
        None: no bound. With deadline scheduling the worker offers a step no more, the least slack first."""
        return None

    def stats(self) -> dict[str, float]:
        """Gauges and counters for /metrics (e.g. kv_blocks_used, kv_blocks_total, preemptions)."""
        return {}

    def node_stats(self) -> dict[str, dict[str, float]]:
        """Per node: batches, items, busy seconds, when the engine counts them itself (else the worker does)."""
        return {}

    def state_count(self) -> int:
        """How many requests hold state in this engine (tests count it back to zero)."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free device memory; called once when the worker shuts down, after the engine's last call."""
