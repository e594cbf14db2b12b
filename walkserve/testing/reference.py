"""The reference executor: runs one request through a model's walks in-process, one node call at a time.

It is the semantic oracle the distributed runtime is checked against, so it
is written as a direct interpreter of the walk plan, independent of the
runtime's dataflow bookkeeping: each scope level runs its units (nodes and
child scopes) in dependency order; a loop runs its body once per iteration
until its bound or stop rule; a streaming consumer runs after its producer's
loop has finished, once per chunk the policy forms from all produced items.
Outputs of iterations a stop rule does not expose are filtered at the end.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from walkserve.core.errors import GraphError
from walkserve.core.finish import FinishReason
from walkserve.core.request import RequestSpec
from walkserve.engines.base import LATER, Engine, Firing, Group
from walkserve.engines.spec import BuildContext
from walkserve.engines.stateless import component_batch
from walkserve.engines.values import concat, to_array, to_tensor
from walkserve.graph.compose import LAST, DynamicLoop
from walkserve.graph.plan import (
    INPUT,
    FromCarry,
    FromEdge,
    FromStream,
    StreamInfo,
    ToClient,
    ToOutput,
    WalkPlan,
    iter_units,
)
from walkserve.graph.stop import resolve_count
from walkserve.graph.walk import WalkGraph
from walkserve.models.base import Model
from walkserve.streaming.policy import Chunk, Span


class _Exhausted(Exception):
    pass


class ComponentFailed(Exception):
    pass


@dataclass(frozen=True)
class ClientOutput:
    modality: str
    walk: str
    node: str
    path: tuple[int, ...]
    value: Any


@dataclass
class ReferenceResult:
    outputs: list[ClientOutput] = field(default_factory=list)
    walks: list[str] = field(default_factory=list)
    walk_outputs: list[dict[str, Any]] = field(default_factory=list)
    finish: FinishReason = FinishReason.STOP
    error: str | None = None

    def stream(self, modality: str) -> list[Any]:
        """Values of one modality in (walk order, node, iteration) order."""
        return [o.value for o in self.outputs if o.modality == modality]


class _WalkRun:
    def __init__(self, plan: WalkPlan, inputs: Mapping[str, Any], request: RequestSpec, call: Callable[[Firing], dict]):
        self.plan = plan
        self.inputs = {k: to_tensor(v) for k, v in inputs.items()}
        self.request = request
        self.params = request.request_params
        self.call = call
        self.env: dict[tuple[str, str, tuple[int, ...]], Any] = {}
        self.exits: dict[tuple[str, str, str, tuple[int, ...]], Any] = {}
        self.exposed: dict[tuple[str, tuple[int, ...]], int] = {}
        self.client: list[ClientOutput] = []
        self.hit_bound = False
        self._items: dict[tuple[int, tuple[int, ...]], list[Any]] = {}
        self._ids = itertools.count()

    # -- execution ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.run_level((), ())
        outputs = {}
        for (src, out), routes in self.plan.routes.items():
            for r in routes:
                if isinstance(r, ToOutput):
                    outputs[r.name] = self.value_from(FromEdge(src, out, r.exits), ())
        self.client = [c for c in self.client if self.is_exposed(c.node, c.path)]
        return outputs

    def run_level(self, level: tuple[str, ...], path: tuple[int, ...]) -> None:
        for unit in iter_units(self.plan, level):
            if unit in self.plan.nodes:
                self.fire(unit, path)
            else:
                self.run_scope(unit, path)

    def run_scope(self, scope_id: str, q: tuple[int, ...]) -> None:
        scope = self.plan.scopes[scope_id]
        if scope.kind == "stream":
            info = self.plan.streams[scope.stream]
            i = 0
            while self.chunk(info, q + (i,)) is not None:
                self.run_level(scope.chain, q + (i,))
                i += 1
            self.exposed[(scope_id, q)] = i
            return
        loop = scope.loop
        n = resolve_count(loop.iterations, self.params, f"loop {loop.name!r}")
        fed = [s for s in self.plan.streams if s.consumer_scope == scope_id]
        exposed, stopped = n, False
        for k in range(n):
            if any(self.chunk(info, q + (k,)) is None for info in fed):
                exposed, stopped = k, True
                break
            self.run_level(scope.chain, q + (k,))
            if isinstance(loop, DynamicLoop):
                node, out = loop.stop.output.split(".")
                if loop.stop.should_stop(self.env[(node, out, q + (k,))], self.params, k):
                    exposed, stopped = (k + 1 if loop.stop.include_stopping else k), True
                    break
        if isinstance(loop, DynamicLoop) and not stopped:
            self.hit_bound = True
        self.exposed[(scope_id, q)] = exposed
        for ep, mode in loop.outputs.items():
            node, out = ep.split(".")
            values = [self.iteration_value(scope_id, node, out, q + (k,)) for k in range(exposed)]
            if mode == LAST:
                if not values:
                    raise ComponentFailed(f"loop {loop.name!r} exposed no iteration, so {ep} has no last value")
                self.exits[(scope_id, node, out, q)] = values[-1]
            else:
                self.exits[(scope_id, node, out, q)] = concat(values)

    def fire(self, name: str, path: tuple[int, ...]) -> None:
        node = self.plan.nodes[name]
        inputs, spans = {}, {}
        for slot in node.inputs:
            source = self.plan.sources[(name, slot)]
            if isinstance(source, FromStream):
                chunk = self.chunk(self.plan.streams[source.stream], path)
                template = self._template(self.plan.streams[source.stream], path)
                inputs[slot] = concat(chunk.items, template)
                spans[slot] = chunk.span
            else:
                inputs[slot] = self.value_from(source, path)
        firing = Firing(
            id=next(self._ids),
            request_id=self.request.id,
            walk=self.plan.name,
            node=name,
            component=node.component,
            op=node.op,
            path=path,
            inputs=inputs,
            outputs=node.outputs,
            params=self.request.params,
            sampling=self.request.sampling,
            node_params=node.params,
            spans=spans,
        )
        outputs = self.call(firing)
        if set(outputs) != set(node.outputs):
            raise ComponentFailed(f"node {name!r} returned outputs {sorted(outputs)}, expected {list(node.outputs)}")
        for out, value in outputs.items():
            self.env[(name, out, path)] = value
            for r in self.plan.routes.get((name, out), ()):
                if isinstance(r, ToClient):
                    self.client.append(ClientOutput(r.modality, self.plan.name, name, path, value))

    # -- values ------------------------------------------------------------------------------
    def value_from(self, source: FromEdge | FromCarry, path: tuple[int, ...]) -> Any:
        if isinstance(source, FromCarry):
            d = self.plan.scopes[source.scope].chain.__len__() - 1
            if path[d] == 0:
                return self.value_from(source.initial, path)
            return self.env[(source.node, source.output, (*path[:d], path[d] - 1))]
        if source.node == INPUT:
            return self.inputs[source.output]
        src_chain = self.plan.chains[source.node]
        if not source.exits:
            return self.env[(source.node, source.output, path[: len(src_chain)])]
        outer = source.exits[-1]
        depth = len(self.plan.scopes[outer].chain) - 1
        return self.exits[(outer, source.node, source.output, path[:depth])]

    def iteration_value(self, scope_id: str, node: str, out: str, path: tuple[int, ...]) -> Any:
        chain = self.plan.chains[node]
        if chain[-1] == scope_id:
            return self.env[(node, out, path)]
        inner = chain[chain.index(scope_id) + 1]
        return self.exits[(inner, node, out, path)]

    def is_exposed(self, node: str, path: tuple[int, ...]) -> bool:
        chain = self.plan.chains[node]
        for j, scope_id in enumerate(chain):
            count = self.exposed.get((scope_id, path[:j]))
            if count is not None and path[j] >= count:
                return False
        return True

    # -- streams -----------------------------------------------------------------------------
    def items(self, info: StreamInfo, prefix: tuple[int, ...]) -> list[Any]:
        key = (info.index, prefix)
        if key not in self._items:
            found = sorted(
                (p, v)
                for (n, o, p), v in self.env.items()
                if n == info.producer and o == info.output and p[: len(prefix)] == prefix and self.is_exposed(n, p)
            )
            self._items[key] = [v for _, v in found]
        return self._items[key]

    def _prefix(self, info: StreamInfo, path: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        d = len(self.plan.scopes[info.consumer_scope].chain) - 1
        return path[:d], path[d]

    def _template(self, info: StreamInfo, path: tuple[int, ...]) -> Any:
        items = self.items(info, self._prefix(info, path)[0])
        return items[0] if items else None

    def chunk(self, info: StreamInfo, path: tuple[int, ...]) -> Chunk | None:
        """Chunk for the consumer iteration at ``path``; None when the stream has no such chunk."""
        prefix, i = self._prefix(info, path)
        items = self.items(info, prefix)
        span = info.policy.span(i, len(items), True)
        if span is None:
            if info.policy.continue_after_end:
                return Chunk(Span(i, len(items), len(items), 0), ())
            return None
        return Chunk(span, tuple(items[span.start : span.end]))


def _group_of(f: Firing) -> Group:
    """One firing as a group of one member (what an engine runs)."""
    return Group(f.walk, f.node, f.component, f.op, f.outputs, f.node_params, [f.request_id], [f.path], [f.inputs],
                 [f.params], [f.sampling], kv=None if f.kv is None else [f.kv], spans=[f.spans])


def _component_caller(components: Mapping[str, Any]) -> Callable[[Firing], dict]:
    def call(firing: Firing) -> dict:
        comp = components[firing.component]
        try:
            if isinstance(comp, Engine):
                group = _group_of(firing)
                while (result := comp.run_groups([group], may_yield=True)[0][0]) is LATER:
                    pass  # a long prefill goes on over calls
                if isinstance(result, str):
                    raise ComponentFailed(result)
                return result
            return comp.forward_batch(component_batch([firing]))[0]
        except ComponentFailed:
            raise
        except Exception as e:
            raise ComponentFailed(f"node {firing.node!r} failed: {type(e).__name__}: {e}") from e

    return call


class ReferenceExecutor:
    """Runs requests one at a time, in-process, through a model's walks."""

    def __init__(self, graph: WalkGraph, components: Mapping[str, Any]):
        self.graph = graph
        self.components = dict(components)
        self._call = _component_caller(self.components)

    @classmethod
    def for_model(cls, model: Model, device: str = "cpu") -> ReferenceExecutor:
        ctx = BuildContext(rank=0, device=device)
        comps = {name: spec.build(ctx) for name, spec in model.components().items()}
        return cls(model.graph(), comps)

    def run(self, request: RequestSpec, max_walks: int = 64) -> ReferenceResult:
        result = ReferenceResult()
        try:
            start = self.graph.state_machine.first(request)
            while start is not None:
                if len(result.walks) >= max_walks:
                    raise ComponentFailed(f"request ran more than {max_walks} walks")
                self.graph.check_start(start)
                run = _WalkRun(self.graph.plans[start.walk], start.inputs, request, self._call)
                outputs = run.run()
                result.walks.append(start.walk)
                result.outputs.extend(run.client)
                values = {k: to_array(v) for k, v in outputs.items()}
                result.walk_outputs.append(values)
                result.finish = FinishReason.LENGTH if run.hit_bound else FinishReason.STOP
                start = self.graph.state_machine.next(request, start.walk, values)
        except (ComponentFailed, GraphError, ValueError) as e:
            result.finish, result.error = FinishReason.ERROR, str(e)
        return result
