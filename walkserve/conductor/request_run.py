"""One request's progress through its walks, as the conductor tracks it (pure bookkeeping).

The conductor knows which node runs on which rank for this request, which
nodes of the current walk have reported done, and the walk's outputs. When
every node is done and every walk output arrived, the model's state machine
picks the next walk, or the request finishes. A walk that ran wholly on one
rank may be followed there by the next one without asking (WalkStarted):
the conductor then records that walk as if it had started it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from walkserve.core.errors import GraphError
from walkserve.core.finish import FinishReason
from walkserve.core.request import RequestSpec
from walkserve.graph.plan import INPUT, ToNode, ToOutput, WalkPlan
from walkserve.graph.walk import WalkGraph, WalkStart
from walkserve.placement.resolve import touched_contexts
from walkserve.protocol.arrays import plain_value, wire_value
from walkserve.protocol.messages import MoveContexts, StartWalk


@dataclass
class RequestRun:
    spec: RequestSpec
    graph: WalkGraph
    # (plan, node, sticky) -> rank; ``sticky`` (component -> rank) keeps a component where it ran before
    choose_rank: Callable[[WalkPlan, str, dict[str, int]], int]
    local_walks: bool = True  # let a rank that holds a whole walk start the next one itself
    stateful: frozenset[str] = frozenset()  # components whose per-request state moves between ranks
    walk: str | None = None
    walks_run: list[str] = field(default_factory=list)
    pending: set[str] = field(default_factory=set)
    outputs: dict[str, Any] = field(default_factory=dict)
    hit_bound: bool = False
    ranks: dict[str, dict[str, int]] = field(default_factory=dict)  # walk -> node -> rank
    sticky: dict[str, int] = field(default_factory=dict)
    state_at: dict[tuple[str, str], int] = field(default_factory=dict)  # (component, context) -> its rank
    seq: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    firings: int = 0
    admitted_at: float = field(default_factory=time.monotonic)
    queue_s: float = 0.0
    loaded: set[int] = field(default_factory=set)  # ranks whose load count includes this request
    first_output_at: float | None = None
    audio_seen: bool = False
    finished: FinishReason | None = None
    error: str | None = None

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def streams(self) -> bool:
        """It asks for audio from a model whose walks play audio as it streams (a walk declares playback)."""
        return "audio" in self.spec.modalities and any(p.walk.playback for p in self.graph.plans.values())

    def involved_ranks(self) -> set[int]:
        return {r for m in self.ranks.values() for r in m.values()}

    def begin(self) -> list[tuple[int, StartWalk | MoveContexts]]:
        """Choose the first walk; return the StartWalk message for each rank it involves."""
        return self._start(self.graph.state_machine.first(self.spec))

    def _start(self, start: WalkStart) -> list[tuple[int, StartWalk | MoveContexts]]:
        self.graph.check_start(start)
        plan = self.graph.plans[start.walk]
        ranks = {node: self.choose_rank(plan, node, self.sticky) for node in plan.nodes}
        self._record(start.walk, ranks)
        needs: dict[int, set[str]] = defaultdict(set)
        for (src, out), routes in plan.routes.items():
            if src == INPUT:
                for r in routes:
                    if isinstance(r, ToNode):
                        needs[ranks[r.node]].add(out)
                    elif isinstance(r, ToOutput):  # a walk input handed on as a walk output (input.x -> output.y)
                        self.outputs[r.name] = start.inputs[out]
        params, sampling, per_node = self.spec.params, self.spec.sampling, self.spec.node_sampling
        whole = self.local_walks and len(set(ranks.values())) == 1
        spec, sticky = (self.spec, dict(self.sticky)) if whole else (None, {})
        if whole:  # the rank may start the next walk itself: it needs every output, handed-on inputs too
            needs[next(iter(ranks.values()))].update(n for (src, n), routes in plan.routes.items() if src == INPUT
                                                     and any(isinstance(r, ToOutput) for r in routes))
        moves = self._moves(plan, ranks)
        messages: list[tuple[int, Any]] = []
        for (src, dst), contexts in sorted(moves.items()):
            messages.append((src, MoveContexts(self.id, contexts, dst)))
        for rank in sorted(set(ranks.values())):
            inputs = {name: wire_value(start.inputs[name]) for name in sorted(needs[rank])}
            moved_in = sorted(src for src, dst in moves if dst == rank)
            start_walk = StartWalk(self.id, start.walk, ranks, inputs, params, sampling, per_node, spec, sticky, moved_in,
                                   self.streams)
            messages.append((rank, start_walk))
        return messages

    def _moves(self, plan: WalkPlan, ranks: dict[str, int]) -> dict[tuple[int, int], dict[str, list[str]]]:
        """(from rank, to rank) -> {component: contexts} that must move before the walk uses them."""
        moves: dict[tuple[int, int], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for key, rank in self._contexts_at(plan, ranks).items():
            held = self.state_at.get(key)
            if held is not None and held != rank:
                moves[(held, rank)][key[0]].add(key[1])
            self.state_at[key] = rank
        return {k: {c: sorted(names) for c, names in v.items()} for k, v in moves.items()}

    def _contexts_at(self, plan: WalkPlan, ranks: dict[str, int]) -> dict[tuple[str, str], int]:
        """(stateful component, context) -> the rank of the walk's nodes touching it (one, by the placement check)."""
        out = {}
        for node, rank in ranks.items():
            gnode = plan.nodes[node]
            if gnode.component in self.stateful:
                for context in touched_contexts(gnode.params):
                    out[(gnode.component, context)] = rank
        return out

    def _record(self, walk: str, ranks: dict[str, int]) -> None:
        self.walk, self.pending, self.outputs, self.hit_bound = walk, set(ranks), {}, False
        self.walks_run.append(walk)
        self.ranks[walk] = ranks

    def node_done(self, walk: str, nodes: list[str], firings: int, hit_bound: bool) -> bool:
        """Record the end of a rank's nodes of the walk; True when the walk is complete."""
        if walk != self.walk:
            return False
        self.pending.difference_update(nodes)
        self.firings += firings
        self.hit_bound |= hit_bound
        return self.walk_complete()

    def walk_started(self, finished: str, firings: int, walk: str, ranks: dict[str, int]) -> bool:
        """A rank finished ``finished`` and started ``walk`` itself; False if this run has moved on."""
        if finished != self.walk:
            return False
        self.firings += firings
        self._record(walk, dict(ranks))
        self.state_at.update(self._contexts_at(self.graph.plans[walk], ranks))
        return True

    def walk_output(self, walk: str, name: str, value: Any) -> bool:
        if walk != self.walk:
            return False
        self.outputs[name] = plain_value(value)
        return self.walk_complete()

    def walk_complete(self) -> bool:
        walk = self.graph.walks[self.walk]
        return not self.pending and all(o in self.outputs for o in walk.outputs)

    def advance(self) -> list[tuple[int, StartWalk | MoveContexts]]:
        """The current walk is complete: start the next one, or finish (returns no messages)."""
        finished_walk, outputs = self.walk, dict(self.outputs)
        hit = self.hit_bound
        start = self.graph.state_machine.next(self.spec, finished_walk, outputs)
        if start is None:
            self.finished = FinishReason.LENGTH if hit else FinishReason.STOP
            return []
        return self._start(start)

    def next_index(self, key: tuple[str, str]) -> int:
        """The next sequence number of one (modality, output) of this request."""
        if self.first_output_at is None:
            self.first_output_at = time.monotonic()
        i = self.seq[key]
        self.seq[key] += 1
        return i


def safe_advance(run: RequestRun, step: Callable[[], list]) -> tuple[list, str | None]:
    """Run a state-machine step; a model bug or bad walk choice fails the request, never the conductor."""
    try:
        return step(), None
    except GraphError as e:
        return [], str(e)
    except Exception as e:
        return [], f"the model's state machine failed: {type(e).__name__}: {e}"
